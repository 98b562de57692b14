// runtime.cuda_graph: a training step recorded once as one CUDA graph and replayed (issue 31,
// docs/architecture.md "One graph per step"). With static shapes (the image models) and a sync whose
// every step is the same device work (dense over NCCL, or one GPU), the whole step is recorded:
//
//   inputs    the host's per-step values (models/step_capture.h's StepInputs: the optimizer's
//             coefficients for this step's learning rate, the results slot, a test poison) copied
//             from pinned memory into the device control block
//   batch     the batch copied from pinned staging into the model's fixed input buffer
//   BN copy   the running statistics kept on the device (train.skip_nonfinite_steps > 0)
//   forward   the loss left on the device (no read back), backward
//   verdict   a non-finite loss poisons one gradient element, so that ...
//   update    ... the update rule's stages (update_rule.h), recorded from the same list an eager
//             step runs:
//     sync      the dense allreduce (NCCL; nothing on one rank) makes every rank see it (its
//               buckets after backward, on the compute stream: the second stream of an eager
//               step's sync.overlap is not recorded, comm/sync/methods/dense/dense.h)
//     clip      the synced gradient's norm decides on the device: not finite -> the step is
//               skipped; optim.grad_clip_norm scales by the host's rule (optim/clip.h)
//     optimizer the update reads its coefficients from the control block and does nothing when
//               skipped
//     after_step the method's (nothing for dense)
//   BN back   a skipped step puts the BN statistics back
//   result    {loss sum, correct, skipped} into a ring slot; the device counts applied updates
//
// The host does per step only what cannot be on the device: it waits for the previous launch (the
// pinned inputs and batch are then free), copies the next batch into pinned memory, agrees with the
// other ranks on stop signals (the lockstep control message without its gradient read), fills the
// inputs and launches. It reads the results ring when it drains: every train.log_every_steps, before
// evaluations, checkpoints and stops, and when the ring is full; the metrics, the non-finite guard
// and the divergence guard then see every pending step in order.
//
// Eager warmup steps come first (cuDNN's algorithm search, workspaces and every buffer a step grows
// are made there; a recorded step must not allocate), and again after each evaluation, whose other
// batch size may move buffers the graph had baked in.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_log.h"
#include "comm/sync/gradient_sync.h"
#include "models/backend.h"
#include "models/device_buffer.h"
#include "optim/optimizer.h"
#include "trainer/config/config.h"
#include "trainer/tasks/task.h"
#include "trainer/step/update_rule.h"

namespace trainer::app {

// Why the steps of this run cannot be recorded, as the one line the run prints; "" when they are
// not asked to be (runtime.cuda_graph = false, or the CPU); nullopt when they can.
// `sync_on_device`: the sync's collectives run on the device (NCCL); `ranks`: the training ranks.
std::optional<std::string> cuda_graph_refusal(const Config& config, models::Backend& backend, Task& task,
                                              bool sync_on_device, int ranks);

// A launched step once its results are read.
struct GraphStepResult {
  int64_t step = 0;
  double lr = 0;
  double loss = 0;  // the batch mean, as StepResult's
  int64_t correct = 0;
  bool applied = false;
};

class StepGraph {
 public:
  // `update`: the worker's (recordable) update rule, whose stages the graph records.
  StepGraph(models::Backend& backend, Task& task, UpdateRule& update, optim::Optimizer& optimizer,
            comm::SyncBuffers& buffers, comm::CommLog& log, bool keep_bn_statistics);
  ~StepGraph();

  // Whether the next step is to be recorded or replayed (else: an eager step, counted as warmup).
  bool ready() const { return eager_left_ <= 0 && optimizer_.step_count() > 0; }
  void eager_step_done() { --eager_left_; }
  // Records the step when nothing is recorded (on the loaded batch; `after_backward` runs where the
  // eager step weights the gradient). Returns "" or why it failed: then nothing ran and the caller
  // runs its steps eagerly from then on.
  std::string record_if_needed(int64_t step, const std::function<void()>& after_backward);
  // Launches step `step` at learning rate `lr` on the loaded batch of `samples`; `poison`: the test
  // hook's NaN.
  void launch(int64_t step, double lr, int64_t samples, bool poison);
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }
  bool full() const { return pending() >= models::kMaxPendingSteps; }
  // Waits for every launched step and returns their results in order.
  std::vector<GraphStepResult> drain();
  // The graph may hold pointers that are no longer the step's (an evaluation ran): record again
  // after `warmup` eager steps.
  void invalidate(int warmup = 1);
  // One line on the recorded graph, for the log (after the first recording).
  std::string describe() const;
  comm::SyncStats stats() const { return stats_; }

 private:
  std::string record(int64_t step, const std::function<void()>& after_backward);

  models::Backend& backend_;
  models::StepCapture& capture_;
  Task& task_;
  UpdateRule& update_;
  optim::Optimizer& optimizer_;  // its update count and per-step coefficients (the host's half)
  comm::SyncBuffers& buffers_;
  comm::CommLog& log_;
  models::DeviceBuffer bn_backup_;  // the BN statistics at the step's start (skip_nonfinite_steps > 0)
  int eager_left_ = 2;
  bool fresh_ = false;                        // recorded, not launched yet: the batch is staged
  std::vector<comm::DeferredCall> collectives_;  // the sync's calls, as recorded: logged at each launch
  comm::SyncStats stats_;
  int64_t host_updates_ = 0;  // optimizer updates applied as of the last drain
  struct Pending {
    int64_t step, samples;
    double lr;
  };
  std::vector<Pending> pending_;
  std::vector<models::StepResult> results_;
};

}  // namespace trainer::app
