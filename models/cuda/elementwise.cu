// Memory-bound element-wise ops of the CUDA backend: ReLU, add, scale, bias rows.
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

__global__ void relu_forward_kernel(int64_t n, const float* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void relu_backward_kernel(int64_t n, const float* y, const float* dy, float* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

__global__ void add_kernel(int64_t n, const float* a, const float* b, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}

__global__ void subtract_kernel(int64_t n, const float* a, const float* b, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] - b[i];
}

// Backend::lerp, the CPU's two fused multiply-adds (models/cpu/sync_ops.cpp) spelled out the same.
__global__ void lerp_kernel(int64_t n, const float* start, float weight, float* y) {
  const bool near_start = fabsf(weight) < 0.5f;
  const float rest = 1.f - weight;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float d = __fsub_rn(y[i], start[i]);
    y[i] = near_start ? __fmaf_rn(weight, d, start[i]) : __fmaf_rn(-d, rest, y[i]);
  }
}

__global__ void scale_kernel(int64_t n, float alpha, float* x) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= alpha;
}

__global__ void broadcast_rows_kernel(int64_t rows, int64_t cols, const float* bias, float* y) {
  const int64_t n = rows * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = bias[i % cols];
}

}  // namespace

cudaError_t launch_relu_forward(int64_t n, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t launch_relu_backward(int64_t n, const float* y, const float* dy, float* dx, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t launch_add(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t launch_subtract(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  subtract_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t launch_lerp(int64_t n, const float* start, float weight, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  lerp_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, start, weight, y);
  return cudaGetLastError();
}

cudaError_t launch_scale(int64_t n, float alpha, float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t launch_broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  broadcast_rows_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
