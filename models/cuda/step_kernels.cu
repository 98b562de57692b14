// The kernels of a captured step (models/step_capture.h): the decisions the eager step makes on the
// host (is the loss finite? the gradient after the sync? by how much to clip?) made on the device
// from the control block, so that the step needs no read back. Each one mirrors the host's
// arithmetic in the same precision (doubles where the host uses doubles), so captured and eager
// steps agree bit for bit.
#include <cmath>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

__global__ void begin_step_kernel(StepControl* c) { c->skip = 0; }

// trainer/step/step_clock.cpp's verdict: a non-finite loss skips the step on every rank; here it poisons
// one gradient element, which the sync spreads to every rank's check_and_clip.
__global__ void poison_kernel(StepControl* c, float* grad_element) {
  if (c->in.poison || !isfinite(c->loss[0])) *grad_element = nanf("");
}

// optim/clip.cpp: norm = sqrt(sum of squares) in double, coef = max_norm / (norm + 1e-6) rounded to
// float and applied when below 1; trainer/step/update_rule.cpp: a non-finite norm skips the step.
__global__ void clip_decide_kernel(StepControl* c, double max_norm) {
  const double norm = sqrt(c->norm_sq);
  if (!isfinite(norm)) c->skip = 1;
  float scale = 1.f;
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) scale = static_cast<float>(coef);
  }
  c->clip_scale = scale;
}

// x * 1.f == x, so a gradient that is not clipped keeps its bits.
__global__ void scale_by_control_kernel(int64_t n, const StepControl* c, float* x) {
  const float s = c->clip_scale;
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= s;
}

__global__ void copy_if_skipped_kernel(int64_t n, const StepControl* c, const float* src, float* dst) {
  if (!c->skip) return;
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = src[i];
}

__global__ void end_step_kernel(StepControl* c) {
  StepResult& r = c->results[c->in.slot];
  r.loss_sum = c->loss[0];
  r.correct = c->loss[1];
  r.skipped = c->skip;
  if (!c->skip) ++c->updates_applied;
}

}  // namespace

cudaError_t launch_begin_step(StepControl* c, cudaStream_t stream) {
  begin_step_kernel<<<1, 1, 0, stream>>>(c);
  return cudaGetLastError();
}

cudaError_t launch_poison_if_nonfinite(StepControl* c, float* grad_element, cudaStream_t stream) {
  poison_kernel<<<1, 1, 0, stream>>>(c, grad_element);
  return cudaGetLastError();
}

cudaError_t launch_clip_decide(StepControl* c, double max_norm, cudaStream_t stream) {
  clip_decide_kernel<<<1, 1, 0, stream>>>(c, max_norm);
  return cudaGetLastError();
}

cudaError_t launch_scale_by_control(int64_t n, const StepControl* c, float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  scale_by_control_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, c, x);
  return cudaGetLastError();
}

cudaError_t launch_copy_if_skipped(int64_t n, const StepControl* c, const float* src, float* dst,
                                   cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  copy_if_skipped_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, c, src, dst);
  return cudaGetLastError();
}

cudaError_t launch_end_step(StepControl* c, cudaStream_t stream) {
  end_step_kernel<<<1, 1, 0, stream>>>(c);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
