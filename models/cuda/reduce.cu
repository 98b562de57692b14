// Reductions of the CUDA backend: bias gradients (column sums) and the sum of squares behind
// global-norm clipping. Both are deterministic (fixed blocks, fixed order; see column_reduce.cuh).
#include "models/cuda/block_sum.cuh"
#include "models/cuda/column_reduce.cuh"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

struct ReadElement {
  const float* x;
  int64_t cols;
  __device__ double operator()(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

struct StoreFloat {
  float* y;
  __device__ void operator()(int64_t c, double s) const { y[c] = static_cast<float>(s); }
};

// Elements per block of the sum of squares: the CPU's block (models/cpu/optim_ops.cpp).
constexpr int64_t kSquaresBlock = 1 << 16;
constexpr int kSquaresThreads = 256;

__global__ void squares_partial_kernel(int64_t n, const float* x, double* partial) {
  const int64_t begin = blockIdx.x * kSquaresBlock;
  const int64_t end = begin + kSquaresBlock < n ? begin + kSquaresBlock : n;
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kSquaresThreads) s += static_cast<double>(x[i]) * x[i];
  s = block_sum<kSquaresThreads>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void squares_finish_kernel(int64_t blocks, const double* partial, double* result) {
  double s = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += kSquaresThreads) s += partial[b];
  s = block_sum<kSquaresThreads>(s);
  if (threadIdx.x == 0) *result = s;
}

}  // namespace

int64_t column_sum_partials(int64_t rows, int64_t cols) { return ColumnReducePlan::make(rows, cols).partials(); }

cudaError_t launch_sum_rows(int64_t rows, int64_t cols, const float* dy, float* db, double* partial,
                            cudaStream_t stream) {
  return launch_column_reduce(ColumnReducePlan::make(rows, cols), ReadElement{dy, cols}, StoreFloat{db}, partial,
                              stream);
}

int64_t sum_of_squares_partials(int64_t n) { return n > 0 ? (n + kSquaresBlock - 1) / kSquaresBlock : 1; }

cudaError_t launch_sum_of_squares(int64_t n, const float* x, double* partial, double* result, cudaStream_t stream) {
  const int64_t blocks = sum_of_squares_partials(n);
  if (n > 0) {
    squares_partial_kernel<<<static_cast<unsigned>(blocks), kSquaresThreads, 0, stream>>>(n, x, partial);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  squares_finish_kernel<<<1, kSquaresThreads, 0, stream>>>(n > 0 ? blocks : 0, partial, result);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
