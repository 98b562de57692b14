// One training step as one CUDA graph (runtime.cuda_graph; trainer/step/step_graph.h drives it): what a
// backend must offer so that a whole step can be recorded once and replayed. The CPU backend offers
// nothing (Backend::step_capture() is null) and its step never changes.
//
// A replayed graph repeats its kernels with the arguments they had when it was recorded, so
// nothing that changes from step to step may be a kernel argument, and nothing inside the step
// may wait for the device or read a value back. Per-step values live in a StepControl block in
// device memory instead: the host writes its half (StepInputs) into pinned memory before each
// launch and the graph's first node copies it in; the device writes the other half (the step's
// loss, whether it was skipped, the optimizer's update count) and the host reads those back only
// when it drains the steps it launched (every train.log_every_steps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer::models {

// Steps the host may launch before it reads their results (the capacity of the rings below).
constexpr int kMaxPendingSteps = 32;

// The host's half, filled before every launch.
struct StepInputs {
  int32_t slot = 0;    // where this step's StepResult goes in StepControl::results
  int32_t poison = 0;  // test hook (TRAINER_TEST_INJECT_NAN): a NaN into the gradient before the sync
  // The optimizer's per-step coefficients (optim::Optimizer::step_coefficients), one set for every
  // update count the device may hold: entry j is for base_count + j earlier updates. The host does not
  // know how many of its pending steps were skipped (non-finite), the device does (updates_applied).
  int64_t base_count = 0;
  float coefficients[kMaxPendingSteps][4] = {};
};

// What one step leaves for the host.
struct StepResult {
  double loss_sum = 0;  // the batch's summed loss (softmax_cross_entropy's, before the mean)
  double correct = 0;   // right argmaxes
  int32_t skipped = 0;  // 1: a non-finite loss or gradient; nothing was applied
  int32_t pad = 0;
};

// The whole block, in device memory.
struct StepControl {
  StepInputs in;
  // Written by the device during the step.
  double loss[2] = {0, 0};  // the loss's {sum, correct}, where softmax_cross_entropy leaves them
  double norm_sq = 0;       // the synced gradient's sum of squares
  float clip_scale = 1;     // what the gradient is multiplied by (1: no clipping)
  int32_t skip = 0;         // this step changes nothing (the optimizer kernels read it)
  int64_t updates_applied = 0;  // optimizer updates so far (Adam's bias correction counts them)
  StepResult results[kMaxPendingSteps];
};

// The capture machinery of a device backend (the CUDA one: models/cuda/cuda_step_capture.cpp).
// All work is enqueued on the backend's stream.
class StepCapture {
 public:
  virtual ~StepCapture() = default;

  // Recording. Between begin and end every op the backend is asked for is recorded, not run; end
  // returns "" and holds the instantiated graph, or says why the step could not be captured (an op
  // that waits or allocates), and then nothing is held and nothing ran.
  virtual void begin_capture() = 0;
  virtual std::string end_capture() = 0;
  // Runs the held graph once (enqueued; returns at once).
  virtual void launch() = 0;
  // Drops the graph (pointers it baked in may be freed: after an evaluation with other shapes).
  virtual void reset() = 0;
  virtual bool captured() const = 0;
  // Number of nodes in the held graph (for the one line the run prints).
  virtual size_t nodes() const = 0;

  // The control block and its pinned host mirror of the inputs; the graph copies `pinned_inputs()`
  // into control()->in as its first node, so the host fills it before each launch (after waiting()).
  virtual StepControl* control() = 0;  // device memory
  virtual StepInputs* pinned_inputs() = 0;
  // Waits until the last launch is done: its pinned inputs and batch may then be overwritten.
  virtual void wait() = 0;
  // wait(), then the results ring (kMaxPendingSteps entries) into `results` (host).
  virtual void wait_results(StepResult* results) = 0;
  // Before a capture (not recorded; it may allocate): the device-only fields set (skip 0, the
  // update count, the results cleared) and the scratch check_and_clip needs for a gradient of
  // `gradient_elements` floats.
  virtual void prepare(int64_t updates_applied, int64_t gradient_elements) = 0;

  // Host memory the device copies from without a staging copy by the driver (cudaMallocHost): the
  // graph's batch upload must come from such memory.
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;

  // While on, softmax_cross_entropy leaves {loss sum, correct} in control()->loss and returns 0 (no
  // read back). The trainer sets it around the recorded forward pass.
  virtual void set_deferred_loss(bool on) = 0;

  // ---- The step's own kernels (recorded between the parts of the step).
  // Copies the inputs block in and clears the step's skip flag.
  virtual void begin_step() = 0;
  // After backward, before the sync: grad_element = NaN when the loss is not finite or the inputs
  // poison the step, so that the synced gradient is non-finite on every rank alike.
  virtual void poison_if_nonfinite(float* grad_element) = 0;
  // After the sync: the gradient's sum of squares; skip when it is not finite; with max_norm > 0,
  // the gradient scaled by max_norm / (norm + 1e-6) where that is below 1 (optim/clip.h's rule and
  // rounding).
  virtual void check_and_clip(int64_t n, float* grads, double max_norm) = 0;
  // n floats copied from src to dst when the step is skipped (the BN statistics put back).
  virtual void copy_if_skipped(int64_t n, const float* src, float* dst) = 0;
  // Last: the step's StepResult into results[in.slot], and updates_applied + 1 unless skipped.
  virtual void end_step() = 0;
};

}  // namespace trainer::models
