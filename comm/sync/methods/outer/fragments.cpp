#include "comm/sync/methods/outer/fragments.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace trainer::comm {

std::vector<Fragment> plan_fragments(int64_t n, const std::vector<models::ParamView>* views, int64_t count) {
  // Tensor t ends at ends[t]; without views the buffer is one tensor.
  std::vector<int64_t> ends;
  if (views && !views->empty()) {
    for (const auto& v : *views) ends.push_back(v.offset + v.numel());
  } else {
    ends.push_back(n);
  }
  const auto tensors = static_cast<int64_t>(ends.size());
  if (count < 1 || count > tensors)
    throw std::invalid_argument("fragments = " + std::to_string(count) + " must be between 1 and the model's " +
                                std::to_string(tensors) + " parameter tensor(s) (fragments are whole tensors)");
  std::vector<Fragment> plan;
  int64_t first = 0;  // the next fragment's first tensor
  for (int64_t f = 0; f < count; ++f) {
    int64_t last = tensors - 1;  // the last fragment takes the rest
    if (f + 1 < count) {
      // The tensor boundary nearest to (f + 1) n / F, leaving one tensor for each later fragment.
      const double target = static_cast<double>(f + 1) * static_cast<double>(n) / static_cast<double>(count);
      const int64_t latest = tensors - (count - f);  // the highest `last` that leaves them one each
      last = first;
      while (last < latest && static_cast<double>(ends[last]) < target) ++last;
      if (last > first && std::abs(static_cast<double>(ends[last - 1]) - target) <=
                              std::abs(static_cast<double>(ends[last]) - target))
        --last;
    }
    Fragment fr;
    fr.first_tensor = first;
    fr.tensors = last - first + 1;
    fr.begin = first == 0 ? 0 : ends[first - 1];
    fr.end = ends[last];
    plan.push_back(fr);
    first = last + 1;
  }
  return plan;
}

std::string fragment_schedule_problem(int64_t period, int64_t fragments, int64_t delay) {
  if (period < 1) return "period = " + std::to_string(period) + " must be at least 1";
  if (fragments < 1 || fragments > period)
    return "fragments = " + std::to_string(fragments) + " must be between 1 and period = " +
           std::to_string(period) + " (one fragment syncs every period / fragments steps)";
  if (delay < 0 || delay >= period / fragments)
    return "sync_delay = " + std::to_string(delay) + " must be below period / fragments = " +
           std::to_string(period / fragments) + " (a fragment's outer step must land before the next fragment is sent)";
  return "";
}

FragmentSchedule::FragmentSchedule(int64_t period, int64_t fragments, int64_t delay)
    : period_(period), fragments_(fragments), delay_(delay) {
  const std::string problem = fragment_schedule_problem(period, fragments, delay);
  if (!problem.empty()) throw std::invalid_argument(problem);
}

int FragmentSchedule::at(int64_t k) const {
  const int64_t r = k % period_;
  // offset_f = floor((f + 1) H / F) takes every residue at most once (the offsets are at least
  // floor(H / F) >= 1 apart, and offset_{F-1} = H is residue 0).
  for (int64_t f = 0; f < fragments_; ++f)
    if (offset(static_cast<int>(f)) % period_ == r) return static_cast<int>(f);
  return -1;
}

}  // namespace trainer::comm
