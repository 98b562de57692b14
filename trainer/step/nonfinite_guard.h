// The non-finite guard (train.skip_nonfinite_steps): a step whose loss or gradient holds a NaN or an
// infinity changes nothing but the loader position, on every rank alike: no optimizer step, no
// sync state touched (the step clock's verdict comes before the sync), and the BN running
// statistics its forward pass updated are put back. More such steps in a row than the key allows
// (0 by default) end the run with kExitNonFinite.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/parameters.h"

namespace trainer::app {

class NonfiniteGuard {
 public:
  // `last_checkpoint_note` names the checkpoint to go back to, for the error.
  NonfiniteGuard(int64_t allowed_in_a_row, models::ParameterStore& buffers,
                 std::function<std::string()> last_checkpoint_note);

  // Before the forward pass: keeps the BN statistics (on the host: the device's may be a GPU's),
  // only when steps may be skipped.
  void before_forward();
  // The step is skipped because of `what`: restores the statistics (unless `restored`: a recorded
  // step put them back on the device, trainer/step/step_graph.h) and returns the warning line, or throws
  // AgreedError (kExitNonFinite) past the limit.
  std::string skip(int64_t step, const std::string& what, bool restored = false);
  // Whether skipping one more step would end the run (past train.skip_nonfinite_steps).
  bool next_skip_ends_run() const { return in_a_row_ + 1 > allowed_; }
  // The step was applied: the count of skips in a row starts again.
  void applied() { in_a_row_ = 0; }

 private:
  int64_t allowed_;
  models::ParameterStore& buffers_;
  std::function<std::string()> last_checkpoint_note_;
  int64_t in_a_row_ = 0;
  std::vector<float> before_;
};

}  // namespace trainer::app
