#include "trainer/step/step_graph.h"

#include <algorithm>
#include <stdexcept>

#include "comm/sync/registry.h"

namespace trainer::app {

std::optional<std::string> cuda_graph_refusal(const Config& config, models::Backend& backend, Task& task,
                                              bool sync_on_device, int ranks) {
  if (!config.runtime.cuda_graph || backend.is_host()) return std::string();
  const std::string eager = "runtime.cuda_graph: eager steps: ";
  if (!backend.step_capture()) return eager + "runtime.device = \"" + config.runtime.device + "\" cannot record a step";
  if (!task.static_shapes())
    return eager + "the batches of model.arch = \"" + config.model.arch + "\" change shape from step to step";
  if (!comm::sync_method(config.sync.method).can.capturable)
    return eager + "sync.method = \"" + config.sync.method + "\" varies from step to step or reads values back "
           "(dense is recorded)";
  if (ranks > 1 && !sync_on_device)
    return eager + "the gradient sync goes through host staging (MPI), which waits for the device; NCCL "
           "(one GPU per rank) is recorded";
  return std::nullopt;
}

StepGraph::StepGraph(models::Backend& backend, Task& task, UpdateRule& update, optim::Optimizer& optimizer,
                     comm::SyncBuffers& buffers, comm::CommLog& log, bool keep_bn_statistics)
    : backend_(backend),
      capture_(*backend.step_capture()),
      task_(task),
      update_(update),
      optimizer_(optimizer),
      buffers_(buffers),
      log_(log),
      results_(models::kMaxPendingSteps) {
  if (!update.recordable()) throw std::logic_error("StepGraph: the update rule cannot be recorded");
  if (keep_bn_statistics && buffers.n_state > 0) bn_backup_ = models::DeviceBuffer(backend, buffers.n_state);
}

StepGraph::~StepGraph() { capture_.reset(); }

void StepGraph::invalidate(int warmup) {
  if (!pending_.empty()) throw std::logic_error("StepGraph::invalidate with steps not drained");
  capture_.reset();
  eager_left_ = std::max(eager_left_, warmup);
}

// What the step does on the device, in the order an eager step does it (worker.cpp), its update the
// update rule's own stages (update_rule.h), with the host's decisions replaced by the control
// block's (step_graph.h). Nothing here may wait for the device, read a value back or allocate: the
// capture fails if anything does.
std::string StepGraph::record(int64_t step, const std::function<void()>& after_backward) {
  host_updates_ = optimizer_.step_count();
  capture_.prepare(host_updates_, buffers_.n);
  collectives_.clear();
  capture_.begin_capture();
  try {
    capture_.begin_step();
    if (!bn_backup_.empty()) backend_.copy(buffers_.n_state, buffers_.state, bn_backup_.data());
    capture_.set_deferred_loss(true);
    task_.forward_backward();  // uploads the staged batch; the loss stays on the device
    capture_.set_deferred_loss(false);
    after_backward();
    const auto& views = *buffers_.views;
    capture_.poison_if_nonfinite(buffers_.grads + views.back().offset);
    {
      // The sync's collectives are recorded once, untimed (a timing waits for the device), and
      // logged at every launch (launch() below).
      comm::CommLog::Deferral deferred(collectives_, false);
      stats_ = update_.record(step, capture_);
    }
    if (!bn_backup_.empty()) capture_.copy_if_skipped(buffers_.n_state, bn_backup_.data(), buffers_.state);
    capture_.end_step();
  } catch (const std::exception& e) {
    capture_.set_deferred_loss(false);
    const std::string ended = capture_.end_capture();
    capture_.reset();
    return std::string(e.what()) + (ended.empty() ? "" : "; " + ended);
  }
  const std::string ended = capture_.end_capture();
  fresh_ = ended.empty();
  return ended;
}

std::string StepGraph::record_if_needed(int64_t step, const std::function<void()>& after_backward) {
  return capture_.captured() ? std::string() : record(step, after_backward);
}

void StepGraph::launch(int64_t step, double lr, int64_t samples, bool poison) {
  capture_.wait();  // the previous launch has read its inputs and batch
  if (!fresh_) task_.stage_batch();
  fresh_ = false;
  models::StepInputs& in = *capture_.pinned_inputs();
  in.slot = static_cast<int32_t>(pending_.size());
  in.poison = poison ? 1 : 0;
  in.base_count = host_updates_;
  // The device holds host_updates_ + (this step's pending predecessors that were applied).
  for (size_t j = 0; j <= pending_.size(); ++j)
    optimizer_.step_coefficients(lr, host_updates_ + static_cast<int64_t>(j), in.coefficients[j]);
  capture_.launch();
  // Launch time for start and end: the graph's collectives are not timed one by one.
  const int64_t now = log_.now_us();
  std::vector<comm::DeferredCall> calls = collectives_;
  for (auto& c : calls) c.t_start_us = c.t_end_us = now;
  log_.replay(calls, step, stats_.phase);
  pending_.push_back({step, samples, lr});
}

std::vector<GraphStepResult> StepGraph::drain() {
  std::vector<GraphStepResult> out;
  if (pending_.empty()) return out;
  capture_.wait_results(results_.data());
  for (size_t i = 0; i < pending_.size(); ++i) {
    const models::StepResult& r = results_[i];
    const Pending& p = pending_[i];
    GraphStepResult g;
    g.step = p.step;
    g.lr = p.lr;
    g.loss = p.samples > 0 ? r.loss_sum / static_cast<double>(p.samples) : 0.0;
    g.correct = static_cast<int64_t>(r.correct);
    g.applied = r.skipped == 0;
    if (g.applied) ++host_updates_;
    out.push_back(g);
  }
  optimizer_.set_step_count(host_updates_);
  pending_.clear();
  return out;
}

std::string StepGraph::describe() const {
  return "runtime.cuda_graph: each step is one CUDA graph of " + std::to_string(capture_.nodes()) +
         " nodes (recorded after eager warmup steps; the loss is read every train.log_every_steps; its gradient "
         "buckets go out after backward: sync.overlap applies to eager steps)";
}

}  // namespace trainer::app
