// PowerSGD's orthonormalization on the GPU (Backend::orthonormalize_columns): one block per matrix
// of a batch (a bucket's P or Q factors), the CPU's Gram-Schmidt step for step (models/cpu/
// sync_ops.cpp): dot products and norms in double, reduced over the block's threads in a fixed
// tree order, the updates in float. The sums' order differs from the CPU's sequential one, so
// results agree to float rounding, not bit for bit.
#include "models/cuda/block_sum.cuh"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

constexpr int kThreads = 256;

__device__ double column_dot(const float* a, int64_t rows, int64_t cols, int64_t j, int64_t k) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kThreads) s += static_cast<double>(a[i * cols + k]) * a[i * cols + j];
  return block_sum<kThreads>(s);
}

__global__ void orthonormalize_kernel(const TallMatrix* batch) {
  const TallMatrix m = batch[blockIdx.x];
  float* a = m.data;
  const int64_t rows = m.rows, cols = m.cols;
  const int passes = cols > 2 ? 2 : 1;
  for (int64_t j = 0; j < cols; ++j) {
    const double before = sqrt(column_dot(a, rows, cols, j, j));
    for (int pass = 0; pass < passes; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        const float d = static_cast<float>(column_dot(a, rows, cols, j, k));
        for (int64_t i = threadIdx.x; i < rows; i += kThreads) a[i * cols + j] -= d * a[i * cols + k];
        __syncthreads();
      }
    const double norm = sqrt(column_dot(a, rows, cols, j, j));
    // Not finite fails the upper bound (NaN fails both comparisons).
    const bool dependent = !(norm > Backend::kDependentColumn * before) || !(norm <= 1.7976931348623157e308);
    const float scale = dependent ? 0.f : static_cast<float>(1.0 / norm);
    for (int64_t i = threadIdx.x; i < rows; i += kThreads) a[i * cols + j] = dependent ? 0.f : a[i * cols + j] * scale;
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_orthonormalize_columns(int64_t count, const TallMatrix* batch, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  orthonormalize_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(batch);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
