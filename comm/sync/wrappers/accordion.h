// Adaptive compression (sync.<method>.adaptive): Accordion (Agarwal, Wang, Lee, Venkataraman & Papailiopoulos,
// MLSys 2021), the detector of critical learning regimes that picks, per interval of steps, between
// two settings of a compressor: a low-compression one (PowerSGD's sync.powersgd.adaptive_rank, the sparse
// methods' sync.<method>.adaptive_density) for critical regimes and the method's own high-compression one
// (sync.powersgd.rank, sync.<method>.density) elsewhere.
//
// The rule, as the paper and its code define it: the synchronized gradients of an interval (an
// epoch in the paper; sync.<method>.adaptive_interval steps here, 0 = an epoch) are summed per group of
// entries; at the interval's last step the norm of that sum, ||D_cur||, is compared with the
// previous interval's, ||D_prev||:
//   |‖D_prev‖ - ‖D_cur‖| / ‖D_prev‖ >= eta (sync.<method>.adaptive_threshold, the paper's 0.5)
// means the group is in a critical regime and the next interval sends it at low compression;
// otherwise at high compression. A previous norm of zero counts as critical (the paper's code gives
// it a ratio above any threshold). Training starts critical (the paper starts at the low-compression
// setting: early training is the best known critical regime), and the interval after the first
// measured one is critical too, since there is no previous norm to compare with. An interval the
// method did not run through (it began during the dense warmup) is not measured and stays critical. The paper's second
// rule: the interval right after a learning-rate decay is critical for every group (multistep
// schedules; SyncRecipe::lr_decay_steps).
//
// Groups: the paper decides per layer. PowerSGD keeps one factor pair per tensor, so it decides per
// compressed tensor (each matrix its own rank); the sparse methods select over the whole (flat)
// gradient with one k, so for them the whole gradient is one group. The sums are of the method's
// output, the averaged gradient that is bitwise the same on every rank, so every rank takes the
// same decision without a message.
//
// State (saved ahead of the compressor's own; exact resume mid-interval): the settings in use, the
// previous interval's norms, the running sums (n floats) and their steps, and whether a switch is still fresh (made at
// the last boundary, no step since: Ok-Top-k re-derives its thresholds at the step after a switch).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace trainer::comm {

struct AccordionOptions {
  double threshold = 0.5;  // eta
  // Steps per interval: an interval ends after steps s with (s + 1) % interval == 0. 0: an epoch
  // whose length is not known (a method built for --dry-run), and add() refuses.
  int64_t interval = 1;
  // Steps at which the learning rate drops (multistep milestones): the interval after one is critical.
  std::vector<int64_t> lr_decay_steps;
};

// Elements [offset, offset + count) of the method's gradient, judged together.
struct AccordionGroup {
  int64_t offset = 0, count = 0;
};

class Accordion {
 public:
  // `n`: the method's gradient entries; `groups` must lie within them.
  Accordion(int64_t n, std::vector<AccordionGroup> groups, const AccordionOptions& options);

  // The decision for one group at an interval's end: true = critical (low compression next).
  static bool critical(bool has_previous, double previous_norm, double norm, double threshold);

  // Per group: 1 while it is sent at the low-compression setting.
  const std::vector<uint8_t>& low() const { return low_; }
  // The fraction of groups at the low-compression setting, weighted by their entries.
  double low_fraction() const;
  // Adds step `step`'s synchronized gradient (`grads`, the method's n entries) to the interval's
  // sums; after the interval's last step decides the next interval's settings. Returns true when
  // a group's setting changed.
  bool add(const float* grads, int64_t step);
  bool fresh_switch() const { return fresh_; }
  const AccordionOptions& options() const { return options_; }
  int64_t switches() const { return switches_; }
  // The last decision's relative changes per group (-1: none measured), for describe and tests.
  const std::vector<double>& last_change() const { return change_; }

  // Versioned ("accordion", 1); load throws std::runtime_error naming what does not match.
  void save(std::ostream& out) const;
  void load(std::istream& in);

 private:
  void decide(int64_t step);

  int64_t n_;
  std::vector<AccordionGroup> groups_;
  AccordionOptions options_;
  // State.
  std::vector<uint8_t> low_;
  std::vector<double> previous_;  // the last interval's norms
  bool has_previous_ = false;
  std::vector<float> sum_;        // the interval's running sums (allocated at the first add)
  int64_t summed_ = 0;            // steps in them
  bool fresh_ = false;
  int64_t switches_ = 0;
  std::vector<double> change_;
};

}  // namespace trainer::comm
