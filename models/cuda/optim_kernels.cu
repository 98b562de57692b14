// The fused SGD and Adam/AdamW updates (backend.h), element for element the arithmetic of
// models/cpu/optim_ops.cpp: the same float operations in the same order, the same explicit fused
// multiply-adds in Adam. (nvcc may contract SGD's a * b + c into an FMA as the CPU compiler may; the
// two agree within a rounding per step.)
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// A captured step's update (u.control set): the per-step floats from the control block's row for
// the device's update count, and nothing at all when the step is skipped. Every thread reads the
// same few words.
__device__ inline bool captured_coefficients(const StepControl* c, float k[4]) {
  if (c->skip) return false;
  const float* row = c->in.coefficients[c->updates_applied - c->in.base_count];
  for (int i = 0; i < 4; ++i) k[i] = row[i];
  return true;
}

__global__ void sgd_kernel(int64_t n, SgdUpdate u, float* params, const float* grads, float* momentum) {
  if (u.control) {
    float k[4];
    if (!captured_coefficients(u.control, k)) return;
    u.neg_lr = k[0];
    u.decay = k[1];
  }
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float p = params[i];
    // Scaled by the clip's coefficient: as the CPU's scaled loop, grad * s rounded, then fused.
    float g = u.grad_scale == 1.f ? grads[i] + u.wd * p : fmaf(u.wd, p, grads[i] * u.grad_scale);
    if (u.use_momentum) {
      const float b = u.first ? g : u.momentum * momentum[i] + g;
      momentum[i] = b;
      g = u.nesterov ? g + u.momentum * b : b;
    }
    params[i] = p * u.decay + u.neg_lr * g;
  }
}

__global__ void adam_kernel(int64_t n, AdamUpdate u, float* params, const float* grads, float* m, float* v) {
  if (u.control) {
    float k[4];
    if (!captured_coefficients(u.control, k)) return;
    u.neg_step_size = k[0];
    u.decay = k[1];
    u.bc2_sqrt = k[2];
  }
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float p = params[i] * u.decay;
    const float g = fmaf(u.wd, p, grads[i] * u.grad_scale);
    const float mi = fmaf(u.one_minus_b1, g, m[i] * u.b1);
    const float vi = fmaf(u.one_minus_b2 * g, g, v[i] * u.b2);
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / u.bc2_sqrt + u.eps;  // IEEE sqrt and division (no fast math)
    params[i] = p + u.neg_step_size * mi / denom;
  }
}

}  // namespace

cudaError_t launch_sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, u, params, grads, momentum);
  return cudaGetLastError();
}

cudaError_t launch_adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  adam_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, u, params, grads, m, v);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
