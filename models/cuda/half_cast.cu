// sync.wire_dtype on the GPU: dense sync's buckets cast to bf16 or fp16 before their allreduce and
// widened after it (Backend::to_half / from_half). The rounding is models/half_cast.h's, the CPU's
// (not cuda_fp16.h's __float2half_rn, which makes every NaN the same one), so a bucket has the same
// 16 bits on either device; the host emulation (scripts/cuda_emulation) runs these kernels too.
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"
#include "models/half_cast.h"

namespace trainer::models::cuda {
namespace {

// __fmul_rn: the product rounded on its own, as the host's, never contracted into an FMA.
__global__ void to_bf16_scaled_kernel(int64_t n, const float* x, float scale, uint16_t* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = round_to_bf16(__fmul_rn(x[i], scale));
}

__global__ void to_fp16_scaled_kernel(int64_t n, const float* x, float scale, uint16_t* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = round_to_fp16(__fmul_rn(x[i], scale));
}

__global__ void from_fp16_kernel(int64_t n, const uint16_t* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = widen_fp16(x[i]);
}

}  // namespace

cudaError_t launch_to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (format == HalfFormat::kBf16)
    to_bf16_scaled_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, x, scale, y);
  else
    to_fp16_scaled_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, x, scale, y);
  return cudaGetLastError();
}

cudaError_t launch_from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (format == HalfFormat::kBf16) return launch_from_bf16(n, x, y, stream);
  from_fp16_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
