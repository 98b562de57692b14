// runtime.precision = bf16 on the CUDA backend: the copies cuDNN's and cuBLAS's bf16 kernels read
// and write. The rounding is models/bf16.h's, the CPU's (oneDNN's reorders round to nearest even and
// keep NaN quiet), rather than cuda_bf16.h's; the host emulation (scripts/cuda_emulation) runs it too.
#include "models/bf16.h"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

__global__ void to_bf16_kernel(int64_t rows, int64_t cols, const float* x, int64_t ldx, uint16_t* y) {
  const int64_t n = rows * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = round_to_bf16(x[(i / cols) * ldx + i % cols]);
}

__global__ void from_bf16_kernel(int64_t n, const uint16_t* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = widen_bf16(x[i]);
}

}  // namespace

cudaError_t launch_to_bf16_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, uint16_t* y,
                              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  to_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(rows, cols, x, ldx, y);
  return cudaGetLastError();
}

cudaError_t launch_to_bf16(int64_t n, const float* x, uint16_t* y, cudaStream_t stream) {
  return launch_to_bf16_2d(1, n, x, n, y, stream);
}

cudaError_t launch_from_bf16(int64_t n, const uint16_t* x, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  from_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
