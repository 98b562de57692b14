// The faults tests ask a run for, in one place outside the step's code: a failure on one rank at one
// step (--inject-failure RANK:STEP, roles.h), and NaNs in the local gradient
// (TRAINER_TEST_INJECT_NAN="RANK:STEP[,RANK:STEP]...": after that step's backward, in the last
// parameter tensor on that rank). The worker calls it at three points of a step; nothing else in the
// step knows about tests.
#pragma once

#include <cstdint>
#include <set>
#include <utility>

#include "models/backend.h"
#include "models/parameters.h"

namespace trainer::app {

class FaultInjection {
 public:
  // `fail_rank`, `fail_step`: the injected failure (-1: none). Reads TRAINER_TEST_INJECT_NAN;
  // std::runtime_error for a malformed value.
  FaultInjection(int rank, int fail_rank, int64_t fail_step);

  // The start of a step (either kind): throws the injected failure when it is due.
  void step_starts(int64_t step) const;
  // Whether a NaN is due in this step's gradient.
  bool nan_at(int64_t step) const { return nans_.count({rank_, step}) > 0; }
  // An eager step's backward begins: a NaN due is armed, to go into the last tensor's gradient once
  // it is final. (A recorded step's graph poisons it itself: step_graph.h, with nan_at.)
  void arm(int64_t step) { armed_ = nan_at(step); }
  void disarm() { armed_ = false; }
  // Gradient entries [final_from, n) are final: the armed NaN goes in when they hold the last tensor
  // (during backward, before an overlapped bucket takes them away).
  void gradient_final(int64_t final_from, models::ParameterStore& params, models::Backend& backend);

 private:
  int rank_;
  int fail_rank_;
  int64_t fail_step_;
  std::set<std::pair<int, int64_t>> nans_;
  bool armed_ = false;
};

}  // namespace trainer::app
