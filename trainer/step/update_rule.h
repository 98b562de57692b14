// The update rule: how a step's gradient becomes new weights. Three stages, in this order for every
// method (a local update lists them once, and both an eager step and a recorded one, step_graph.h,
// go through that list):
//   share  the sync method combines the gradient over the ranks (GradientSync::reduce); on return
//          the gradient is what the optimizer applies. A remote update (async_ps, whose optimizer
//          runs on the servers) shares nothing yet.
//   clip   optim.grad_clip_norm, on the gradient the optimizer will apply: the synced one, or for
//          async_ps this worker's own (the servers apply each push as one update). Its norm pass is
//          also the check that finite local gradients did not sum to an infinity; the synced
//          gradient is the same on every rank, so every rank decides alike without a message.
//   apply  local: the optimizer step, then the method's after_step (local SGD's parameter
//          averaging); remote: the push to the servers, which reply with the new weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/sync/gradient_sync.h"
#include "models/backend.h"
#include "models/parameters.h"
#include "optim/optimizer.h"
#include "trainer/step/interval_metrics.h"
#include "trainer/step/trace_spans.h"

namespace trainer::app {

struct UpdateOutcome {
  bool applied = false;
  std::string nonfinite;  // not applied: what was not finite (after the sync)
  comm::SyncStats stats;
};

// One of the two rules, chosen once from the method's spec (applies_update): local (the optimizer
// runs here) or remote (async_ps's servers run it).
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // The step's update at learning rate `lr` (a remote update ignores it: the servers run the
  // schedule). Adds its time to `times` and marks the trace.
  virtual UpdateOutcome run(int64_t step, double lr, StepTimes& times, TraceSpans& spans) = 0;
  // Whether a step graph can record it (a remote update waits for the servers' reply: no).
  virtual bool recordable() const = 0;
  // The same stages recorded into `capture` (step_graph.h): the same device work, with the host's
  // decisions (the clip's verdict, the optimizer's coefficients) read from its control block.
  // Returns the sync's stats; the update is applied when the graph is launched.
  virtual comm::SyncStats record(int64_t step, models::StepCapture& capture) = 0;
};

// `remote`: the method applies the update itself (its spec's applies_update, comm/sync/registry.h).
std::unique_ptr<UpdateRule> make_update_rule(bool remote, comm::GradientSync& sync, optim::Optimizer& optimizer,
                                             models::Backend& backend, models::ParameterStore& params,
                                             comm::SyncBuffers& buffers, double clip_norm);

}  // namespace trainer::app
