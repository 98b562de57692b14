#include "models/cuda/fill.h"

namespace trainer::models::cuda {
namespace {

__global__ void fill_kernel(int64_t n, float value, float* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = value;
}

}  // namespace

cudaError_t launch_fill(int64_t n, float value, float* y, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  fill_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(n, value, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
