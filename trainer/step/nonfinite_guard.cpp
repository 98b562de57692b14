#include "trainer/step/nonfinite_guard.h"

#include "trainer/agreed_error.h"

namespace trainer::app {

NonfiniteGuard::NonfiniteGuard(int64_t allowed_in_a_row, models::ParameterStore& buffers,
                               std::function<std::string()> last_checkpoint_note)
    : allowed_(allowed_in_a_row), buffers_(buffers), last_checkpoint_note_(std::move(last_checkpoint_note)) {}

void NonfiniteGuard::before_forward() {
  if (allowed_ > 0) before_ = buffers_.host_values();
}

std::string NonfiniteGuard::skip(int64_t step, const std::string& what, bool restored) {
  ++in_a_row_;
  const std::string where = "non-finite value at step " + std::to_string(step) + ": " + what;
  if (in_a_row_ > allowed_) {
    const std::string limit =
        allowed_ == 0 ? std::string("set train.skip_nonfinite_steps to skip such steps, or lower optim.lr / set "
                                    "optim.grad_clip_norm")
                      : "more than train.skip_nonfinite_steps = " + std::to_string(allowed_) + " steps in a row";
    throw AgreedError(where + " (" + limit + "); " + last_checkpoint_note_(), kExitNonFinite);
  }
  if (!restored) buffers_.copy_values_from_host(before_.data(), before_.size() * sizeof(float));
  return "warning: " + where + "; step skipped on every rank (" + std::to_string(in_a_row_) + " in a row)";
}

}  // namespace trainer::app
