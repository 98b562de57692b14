// The lookahead convolution of DeepSpeech 2 (backend.h): a per-channel filter over the next
// `context` steps of x {T, N, C}, w {C, context + 1}. The CPU loops are in
// models/cpu/sequence_ops.cpp.
//
// Forward and dx are independent per element (each sums its taps in tap order, in float, as the
// CPU). dw sums T*N products per weight: a column reduction in double over fixed row chunks
// (column_reduce.cuh), never atomics, so it does not depend on timing.
#include "models/cuda/column_reduce.cuh"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// Index i runs over {T, N, C} in memory order.
__global__ void lookahead_forward_kernel(int64_t steps, int64_t batch, int64_t channels, int64_t taps, const float* x,
                                         const float* w, float* y) {
  const int64_t row = batch * channels, total = steps * row;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t t = i / row, c = i % channels;
    float acc = 0.f;
    for (int64_t k = 0; k < taps && t + k < steps; ++k) acc += w[c * taps + k] * x[i + k * row];
    y[i] = acc;
  }
}

// dx[s] = sum_k w[:, k] * dy[s - k]: the transpose of forward's sliding window.
__global__ void lookahead_dx_kernel(int64_t steps, int64_t batch, int64_t channels, int64_t taps, const float* w,
                                    const float* dy, float* dx) {
  const int64_t row = batch * channels, total = steps * row;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t s = i / row, c = i % channels;
    float acc = 0.f;
    for (int64_t k = 0; k < taps && k <= s; ++k) acc += w[c * taps + k] * dy[i - k * row];
    dx[i] = acc;
  }
}

// dw as a column sum: rows r = t * N + n of dy, columns (k, c) with c fastest (so a block's 32
// columns read 32 neighbouring channels); row r of column (k, c) is dy[t, n, c] * x[t + k, n, c],
// zero where t + k runs past T.
struct LookaheadProduct {
  const float* dy;
  const float* x;
  int64_t steps, batch, channels;
  __device__ double operator()(int64_t r, int64_t col) const {
    const int64_t k = col / channels, c = col % channels;
    if (r / batch + k >= steps) return 0.0;
    return static_cast<double>(dy[r * channels + c]) * x[(r + k * batch) * channels + c];
  }
};

struct StoreDw {
  float* dw;
  int64_t channels, taps;
  __device__ void operator()(int64_t col, double s) const {
    dw[(col % channels) * taps + col / channels] = static_cast<float>(s);
  }
};

ColumnReducePlan dw_plan(int64_t steps, int64_t batch, int64_t channels, int64_t context) {
  return ColumnReducePlan::make(steps * batch, (context + 1) * channels);
}

}  // namespace

int64_t lookahead_dw_partials(int64_t steps, int64_t batch, int64_t channels, int64_t context) {
  return dw_plan(steps, batch, channels, context).partials();
}

cudaError_t launch_lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                                     const float* w, float* y, cudaStream_t stream) {
  const int64_t total = steps * batch * channels;
  if (total <= 0) return cudaSuccess;
  lookahead_forward_kernel<<<grid_for(total), kThreads, 0, stream>>>(steps, batch, channels, context + 1, x, w, y);
  return cudaGetLastError();
}

cudaError_t launch_lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                                      const float* w, const float* dy, float* dx, float* dw, double* partial,
                                      cudaStream_t stream) {
  const int64_t total = steps * batch * channels;
  if (total > 0) {
    lookahead_dx_kernel<<<grid_for(total), kThreads, 0, stream>>>(steps, batch, channels, context + 1, w, dy, dx);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  // With no rows (T * N = 0) every weight's sum is zero, as on the CPU.
  return launch_column_reduce(dw_plan(steps, batch, channels, context),
                              LookaheadProduct{dy, x, steps, batch, channels}, StoreDw{dw, channels, context + 1},
                              partial, stream);
}

}  // namespace trainer::models::cuda
