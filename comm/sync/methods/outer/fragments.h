// Streaming DiLoCo's fragments and their schedule (Douillard et al. 2025, arXiv 2501.18512;
// torchft's DiLoCo, fragment_sync_offset): the model's tensors cut into F contiguous groups of whole
// tensors, in model order, of about equal sizes, and the inner step at which each group syncs.
//
// Schedule, in inner steps k = 1, 2, ... counted from the method's first step: fragment f syncs
// when k = offset_f (mod H), offset_f = floor((f + 1) H / F), so the fragments take turns every
// H / F steps and each one every H steps (f = F - 1 first at k = H; with F = 1 that is plain
// DiLoCo). With a delay tau its pseudo-gradient is taken and sent tau steps earlier, at
// k = offset_f - tau (mod H). tau < floor(H / F) keeps at most one fragment in flight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/parameters.h"

namespace trainer::comm {

struct Fragment {
  int64_t begin = 0, end = 0;             // elements [begin, end) of the flat parameters
  int64_t first_tensor = 0, tensors = 0;  // views [first_tensor, first_tensor + tensors)
  int64_t size() const { return end - begin; }
};

// F fragments of whole tensors over `views` (store order, contiguous from 0, covering [0, n)); null
// or empty views: the buffer is one tensor. Each boundary is the tensor boundary nearest to k n / F
// that leaves every fragment at least one tensor. Throws std::invalid_argument naming
// sync.<method>.fragments when F < 1 or F exceeds the number of tensors.
std::vector<Fragment> plan_fragments(int64_t n, const std::vector<models::ParamView>* views, int64_t count);

// What is wrong with a schedule of H = period, F = fragments and tau = delay, naming the keys (F
// above H, tau at or above floor(H / F)); empty when it is fine. The one statement of the rule:
// the config (through diloco's check) and FragmentSchedule both ask it.
std::string fragment_schedule_problem(int64_t period, int64_t fragments, int64_t delay);

class FragmentSchedule {
 public:
  // Throws std::invalid_argument with fragment_schedule_problem's line.
  FragmentSchedule(int64_t period, int64_t fragments, int64_t delay);
  // The fragment whose pseudo-gradient is taken and sent after inner step k, or -1.
  int starts_after(int64_t k) const { return at(k + delay_); }
  // The fragment whose outer step is applied after inner step k, or -1.
  int finishes_after(int64_t k) const { return at(k); }
  int64_t offset(int f) const { return (f + 1) * period_ / fragments_; }
  int64_t period() const { return period_; }
  int64_t delay() const { return delay_; }

 private:
  int at(int64_t k) const;  // the fragment f with offset_f = k (mod H), or -1
  int64_t period_, fragments_, delay_;
};

}  // namespace trainer::comm
