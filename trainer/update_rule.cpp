#include "trainer/update_rule.h"

#include <chrono>
#include <cmath>

#include "optim/clip.h"
#include "trainer/step_clock.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// What both rules share: the parts of a step, and the clip that also checks the gradient is finite.
class RuleBase : public UpdateRule {
 public:
  RuleBase(comm::GradientSync& sync, optim::Optimizer& optimizer, models::Backend& backend,
           models::ParameterStore& params, comm::SyncBuffers& buffers, double clip_norm)
      : sync_(sync), optimizer_(optimizer), backend_(backend), params_(params), buffers_(buffers), clip_norm_(clip_norm) {}

 protected:
  // optim.grad_clip_norm on the gradient the optimizer applies; false (and `outcome` says what) when
  // it is not finite.
  bool clip(UpdateOutcome& outcome) {
    const double norm = optim::clip_grad_norm(backend_, params_.grads(), params_.size(), clip_norm_);
    if (std::isfinite(norm)) return true;
    outcome.nonfinite = nonfinite_item(first_nonfinite_gradient(backend_, params_), params_) + " after the gradient sync";
    return false;
  }

  comm::GradientSync& sync_;
  optim::Optimizer& optimizer_;
  models::Backend& backend_;
  models::ParameterStore& params_;
  comm::SyncBuffers& buffers_;
  double clip_norm_;
};

// share, clip, apply here: the sync method combines the gradient, the optimizer steps, then the
// method's after_step (local SGD's parameter averaging).
class LocalUpdate final : public RuleBase {
 public:
  using RuleBase::RuleBase;
  UpdateOutcome run(int64_t step, double lr, StepTimes& times, TraceSpans& spans) override {
    UpdateOutcome outcome;
    // Each phase's clock stops once the device has done the phase's work (backend_.synchronize: a
    // no-op on the CPU): a GPU's kernels run after the host enqueued them, and without the wait
    // their time would land in whichever phase waits next (the sync's share of a one-GPU run read
    // 55-65%).
    auto t0 = Clock::now();
    outcome.stats = sync_.reduce(buffers_, step);
    backend_.synchronize();
    times.sync += ms_since(t0);
    spans.mark("sync");
    t0 = Clock::now();
    if (!clip(outcome)) return outcome;
    optimizer_.step(params_.values(), params_.grads(), lr);
    backend_.synchronize();
    times.optim += ms_since(t0);
    spans.mark("optimizer");
    t0 = Clock::now();
    sync_.after_step(buffers_, step);
    backend_.synchronize();
    times.sync += ms_since(t0);
    spans.mark("after_step");
    outcome.applied = true;
    return outcome;
  }
};

// clip this worker's own gradient (the servers apply each push as one update), then push it: the
// servers reply with the new weights.
class RemoteUpdate final : public RuleBase {
 public:
  using RuleBase::RuleBase;
  UpdateOutcome run(int64_t step, double, StepTimes& times, TraceSpans& spans) override {
    UpdateOutcome outcome;
    auto t0 = Clock::now();
    // The step clock found this worker's gradient finite, so its norm is too (a sum of squares of
    // floats in double), and the push the servers wait for always goes out.
    if (!clip(outcome)) return outcome;
    times.optim += ms_since(t0);
    t0 = Clock::now();
    outcome.stats = sync_.reduce(buffers_, step);
    times.sync += ms_since(t0);
    spans.mark("sync");
    outcome.applied = true;
    return outcome;
  }
};

}  // namespace

std::unique_ptr<UpdateRule> make_update_rule(bool remote, comm::GradientSync& sync, optim::Optimizer& optimizer,
                                             models::Backend& backend, models::ParameterStore& params,
                                             comm::SyncBuffers& buffers, double clip_norm) {
  if (remote) return std::make_unique<RemoteUpdate>(sync, optimizer, backend, params, buffers, clip_norm);
  return std::make_unique<LocalUpdate>(sync, optimizer, backend, params, buffers, clip_norm);
}

}  // namespace trainer::app
