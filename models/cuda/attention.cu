// Dot-product attention of the CUDA backend (backend.h: attention_forward, attention_backward), as
// Listen-Attend-Spell's speller uses it: one block per query row. Every sum runs in a fixed order
// (a warp's lanes in a fixed shuffle tree, the block's threads in a fixed shared-memory tree, the
// weighted sums over steps one by one), so a result depends on the shapes only; the softmax
// subtracts the row's maximum, as the CPU loop does.
#include <cmath>

#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

constexpr int kAttentionThreads = 256, kWarpSize = 32, kWarps = kAttentionThreads / kWarpSize;

// <a, b> over n floats by one warp: lane l sums elements l, l + 32, ...; then a shuffle tree. Lane 0
// holds the result. Every lane of the warp must call it (the shuffles name all 32).
__device__ float warp_dot(const float* a, const float* b, int64_t n, int lane) {
  float s = 0.f;
  for (int64_t i = lane; i < n; i += kWarpSize) s += a[i] * b[i];
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
  return s;
}

// The block's threads combined in a fixed tree; every thread gets the result. `shared` holds
// kAttentionThreads floats and is free again when this returns.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kAttentionThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      shared[threadIdx.x] = kMax ? fmaxf(shared[threadIdx.x], shared[threadIdx.x + half])
                                 : shared[threadIdx.x] + shared[threadIdx.x + half];
    __syncthreads();
  }
  const float result = shared[0];
  __syncthreads();
  return result;
}

// The row -> utterance map and lengths (host_ints.h); an empty map is the identity.
__device__ inline int64_t utterance_of(const HostInts& row_utterance, int64_t r) {
  return row_utterance.count ? row_utterance.v[r] : r;
}

// Row r: energies <q_r, k_{u, tau}> into alpha's row (its scratch until the softmax replaces them),
// the softmax over tau < len, zeros past it, then context_r = sum_tau alpha_tau v_{u, tau}.
__global__ void attention_forward_kernel(int64_t rows, int64_t steps, int64_t dim, int64_t cols, HostInts lengths,
                                         HostInts row_utterance, const float* query, const float* keys,
                                         const float* values, float* alpha, float* context, int64_t ldc) {
  __shared__ float shared[kAttentionThreads];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform in the block: the barriers are safe
    const int64_t u = utterance_of(row_utterance, r), len = lengths.v[u];
    const float* q = query + r * dim;
    const float* k = keys + u * steps * dim;
    const float* v = values + u * steps * cols;
    float* a = alpha + r * steps;
    for (int64_t tau = warp; tau < len; tau += kWarps) {
      const float e = warp_dot(k + tau * dim, q, dim, lane);
      if (lane == 0) a[tau] = e;
    }
    __syncthreads();  // the energies (global memory) are visible to the whole block after the barrier
    float top = -INFINITY;
    for (int64_t tau = threadIdx.x; tau < len; tau += kAttentionThreads) top = fmaxf(top, a[tau]);
    top = block_reduce<true>(top, shared);
    float sum = 0.f;
    for (int64_t tau = threadIdx.x; tau < len; tau += kAttentionThreads) {
      const float e = expf(a[tau] - top);
      a[tau] = e;
      sum += e;
    }
    sum = block_reduce<false>(sum, shared);
    for (int64_t tau = threadIdx.x; tau < steps; tau += kAttentionThreads) a[tau] = tau < len ? a[tau] / sum : 0.f;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < cols; j += kAttentionThreads) {
      float c = 0.f;
      for (int64_t tau = 0; tau < len; ++tau) c += a[tau] * v[tau * cols + j];
      context[r * ldc + j] = c;
    }
  }
}

// Row r: dalpha_tau = <v_{u, tau}, dcontext_r> into denergy's row, then denergy = alpha (dalpha -
// <alpha, dalpha>) (zero past len), then dquery_r = sum_tau denergy_tau k_{u, tau}.
__global__ void attention_backward_kernel(int64_t rows, int64_t steps, int64_t dim, int64_t cols, HostInts lengths,
                                          HostInts row_utterance, const float* keys, const float* values,
                                          const float* alpha, const float* dcontext, float* denergy, float* dquery) {
  __shared__ float shared[kAttentionThreads];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t u = utterance_of(row_utterance, r), len = lengths.v[u];
    const float* k = keys + u * steps * dim;
    const float* v = values + u * steps * cols;
    const float* a = alpha + r * steps;
    const float* dc = dcontext + r * cols;
    float* de = denergy + r * steps;
    for (int64_t tau = warp; tau < len; tau += kWarps) {
      const float d = warp_dot(v + tau * cols, dc, cols, lane);
      if (lane == 0) de[tau] = d;
    }
    __syncthreads();
    float dot = 0.f;
    for (int64_t tau = threadIdx.x; tau < len; tau += kAttentionThreads) dot += a[tau] * de[tau];
    dot = block_reduce<false>(dot, shared);
    for (int64_t tau = threadIdx.x; tau < steps; tau += kAttentionThreads)
      de[tau] = tau < len ? a[tau] * (de[tau] - dot) : 0.f;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < dim; j += kAttentionThreads) {
      float s = 0.f;
      for (int64_t tau = 0; tau < len; ++tau) s += de[tau] * k[tau * dim + j];
      dquery[r * dim + j] = s;
    }
  }
}

unsigned blocks_for_rows(int64_t rows) { return static_cast<unsigned>(rows < 65535 ? rows : 65535); }

}  // namespace

cudaError_t launch_attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const HostInts& lengths,
                                     const HostInts& row_utterance, const float* query, const float* keys,
                                     const float* values, float* alpha, float* context, int64_t ldc,
                                     cudaStream_t stream) {
  if (rows <= 0 || steps <= 0) return cudaSuccess;
  attention_forward_kernel<<<blocks_for_rows(rows), kAttentionThreads, 0, stream>>>(
      rows, steps, dim, cols, lengths, row_utterance, query, keys, values, alpha, context, ldc);
  return cudaGetLastError();
}

cudaError_t launch_attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const HostInts& lengths,
                                      const HostInts& row_utterance, const float* keys, const float* values,
                                      const float* alpha, const float* dcontext, float* denergy, float* dquery,
                                      cudaStream_t stream) {
  if (rows <= 0 || steps <= 0) return cudaSuccess;
  attention_backward_kernel<<<blocks_for_rows(rows), kAttentionThreads, 0, stream>>>(
      rows, steps, dim, cols, lengths, row_utterance, keys, values, alpha, dcontext, denergy, dquery);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
