#include "trainer/update_rule.h"

#include <chrono>
#include <cmath>

#include "optim/clip.h"
#include "trainer/step_clock.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

UpdateRule::UpdateRule(comm::GradientSync& sync, bool remote, optim::Optimizer& optimizer, models::Backend& backend,
                       models::ParameterStore& params, comm::SyncBuffers& buffers, double clip_norm)
    : sync_(sync),
      optimizer_(optimizer),
      backend_(backend),
      params_(params),
      buffers_(buffers),
      clip_norm_(clip_norm),
      remote_(remote) {}

UpdateOutcome UpdateRule::run(int64_t step, double lr, StepTimes& times, TraceSpans& spans) {
  UpdateOutcome outcome;
  auto t0 = Clock::now();
  // Each phase's clock stops once the device has done the phase's work (backend_.synchronize: a
  // no-op on the CPU): a GPU's kernels run after the host enqueued them, and without the wait their
  // time would land in whichever phase waits next (the sync's share of a one-GPU run read 55-65%).
  if (!remote_) {
    outcome.stats = sync_.reduce(buffers_, step);
    backend_.synchronize();
    times.sync += ms_since(t0);
    spans.mark("sync");
  }

  t0 = Clock::now();
  const double norm = optim::clip_grad_norm(backend_, params_.grads(), params_.size(), clip_norm_);
  // Remote: the step clock found this worker's gradient finite, so its norm is too (a sum of
  // squares of floats in double), and the push the servers wait for always goes out.
  if (!std::isfinite(norm)) {
    outcome.nonfinite = nonfinite_item(first_nonfinite_gradient(backend_, params_), params_) + " after the gradient sync";
    return outcome;
  }
  if (remote_) {
    times.optim += ms_since(t0);
    t0 = Clock::now();
    outcome.stats = sync_.reduce(buffers_, step);
    times.sync += ms_since(t0);
    spans.mark("sync");
  } else {
    optimizer_.step(params_.values(), params_.grads(), lr);
    backend_.synchronize();
    times.optim += ms_since(t0);
    spans.mark("optimizer");
    t0 = Clock::now();
    sync_.after_step(buffers_, step);
    backend_.synchronize();
    times.sync += ms_since(t0);
    spans.mark("after_step");
  }
  outcome.applied = true;
  return outcome;
}

}  // namespace trainer::app
