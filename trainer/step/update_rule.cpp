#include "trainer/step/update_rule.h"

#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

#include "optim/clip.h"
#include "trainer/step/step_clock.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// What both rules share: the parts of a step, and the clip that also checks the gradient is finite.
// The clip's norm is this gradient's one pass of its own: a local update hands its coefficient to
// the optimizer (Optimizer::step's grad_scale, applied in the update's pass); a remote one scales the
// gradient it pushes.
class RuleBase : public UpdateRule {
 public:
  RuleBase(comm::GradientSync& sync, optim::Optimizer& optimizer, models::Backend& backend,
           models::ParameterStore& params, comm::SyncBuffers& buffers, double clip_norm)
      : sync_(sync), optimizer_(optimizer), backend_(backend), params_(params), buffers_(buffers), clip_norm_(clip_norm) {}

 protected:
  // optim.grad_clip_norm on the gradient the optimizer applies: its coefficient in grad_scale_
  // (1 when it does not bind), or, with `in_place`, the gradient scaled by it. False (and `outcome`
  // says what) when the gradient is not finite.
  bool clip(UpdateOutcome& outcome, bool in_place) {
    const double norm = in_place ? optim::clip_grad_norm(backend_, params_.grads(), params_.size(), clip_norm_)
                                 : optim::global_norm(backend_, params_.grads(), params_.size());
    grad_scale_ = in_place ? 1.f : optim::clip_coefficient(norm, clip_norm_);
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
  float grad_scale_ = 1.f;  // this step's clip coefficient, for the optimizer's update
};

// share, clip, apply here: the sync method combines the gradient, the optimizer steps, then the
// method's after_step (local SGD's parameter averaging). The stages are listed once (stages_), each
// as an eager step runs it and as a recorded step records it, so the two cannot drift apart; apply
// is two entries, the optimizer's and after_step, whose times count in different phases.
class LocalUpdate final : public RuleBase {
 public:
  LocalUpdate(comm::GradientSync& sync, optim::Optimizer& optimizer, models::Backend& backend,
              models::ParameterStore& params, comm::SyncBuffers& buffers, double clip_norm)
      : RuleBase(sync, optimizer, backend, params, buffers, clip_norm),
        stages_{
            {"sync", &StepTimes::sync,
             [this](int64_t step, double, UpdateOutcome& o) { return share(step, o); },
             [this](int64_t step, models::StepCapture&, UpdateOutcome& o) { share(step, o); }},
            // The clip decides on the host (its norm is read back) and its scale is the optimizer's
            // to apply; a graph decides on the device, scales there, and skips the step's update
            // where the gradient is not finite.
            {nullptr, &StepTimes::optim, [this](int64_t, double, UpdateOutcome& o) { return clip(o, false); },
             [this](int64_t, models::StepCapture& capture, UpdateOutcome&) {
               capture.check_and_clip(params_.size(), params_.grads(), clip_norm_);
             }},
            // A graph's optimizer reads this step's coefficients (its learning rate) from the
            // control block.
            {"optimizer", &StepTimes::optim,
             [this](int64_t, double lr, UpdateOutcome&) {
               optimizer_.step(params_.values(), params_.grads(), lr, grad_scale_);
               return true;
             },
             [this](int64_t, models::StepCapture& capture, UpdateOutcome&) {
               optimizer_.graph_step(params_.values(), params_.grads(), capture.control());
             }},
            {"after_step", &StepTimes::sync,
             [this](int64_t step, double, UpdateOutcome&) {
               sync_.after_step(buffers_, step);
               return true;
             },
             [this](int64_t step, models::StepCapture&, UpdateOutcome&) { sync_.after_step(buffers_, step); }},
        } {}

  UpdateOutcome run(int64_t step, double lr, StepTimes& times, TraceSpans& spans) override {
    UpdateOutcome outcome;
    for (const Stage& stage : stages_) {
      const auto t0 = Clock::now();
      if (!stage.run(step, lr, outcome)) return outcome;
      // Each phase's clock stops once the device has done the phase's work (a no-op on the CPU):
      // a GPU's kernels run after the host enqueued them, and without the wait their time would
      // land in whichever phase waits next (the sync's share of a one-GPU run read 55-65%).
      backend_.synchronize();
      times.*stage.phase += ms_since(t0);
      if (stage.span) spans.mark(stage.span);
    }
    outcome.applied = true;
    return outcome;
  }

  bool recordable() const override { return true; }

  comm::SyncStats record(int64_t step, models::StepCapture& capture) override {
    UpdateOutcome outcome;
    for (const Stage& stage : stages_) stage.record(step, capture, outcome);
    return outcome.stats;
  }

 private:
  bool share(int64_t step, UpdateOutcome& outcome) {
    outcome.stats = sync_.reduce(buffers_, step);
    return true;
  }

  struct Stage {
    const char* span;           // the trace mark after it (null: none)
    double StepTimes::*phase;   // where its time counts
    // Eager: false ends the update unapplied (the outcome says why).
    std::function<bool(int64_t step, double lr, UpdateOutcome&)> run;
    std::function<void(int64_t step, models::StepCapture&, UpdateOutcome&)> record;
  };
  const std::vector<Stage> stages_;
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
    if (!clip(outcome, /*in_place=*/true)) return outcome;  // the push carries the clipped gradient
    times.optim += ms_since(t0);
    t0 = Clock::now();
    outcome.stats = sync_.reduce(buffers_, step);
    times.sync += ms_since(t0);
    spans.mark("sync");
    outcome.applied = true;
    return outcome;
  }

  bool recordable() const override { return false; }
  comm::SyncStats record(int64_t, models::StepCapture&) override {
    throw std::logic_error("a remote update cannot be recorded: the servers' reply is read back");
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
