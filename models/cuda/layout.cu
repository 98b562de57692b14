// Activations in their layout <-> PyTorch's NCHW order (Flatten before a Linear, exports).
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// Index i runs over NCHW order, so the NCHW side is read or written contiguously.
__global__ void nchw_kernel(const float* src, ActivationDims d, float* dst, bool to_nchw) {
  const int64_t total = d.n * d.c * d.h * d.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t w = i % d.w, h = (i / d.w) % d.h, c = (i / (d.w * d.h)) % d.c, n = i / (d.w * d.h * d.c);
    const int64_t o = element_offset(d, n, c, h, w);
    if (to_nchw) dst[i] = src[o];
    else dst[o] = src[i];
  }
}

}  // namespace

ActivationDims dims_of(const Tensor& t) {
  ActivationDims d;
  d.n = t.dim(0);
  d.c = t.dim(1);
  d.h = t.rank() > 2 ? t.dim(2) : 1;
  d.w = t.rank() > 3 ? t.dim(3) : 1;
  d.blocked16 = t.layout == Layout::kBlocked16;
  return d;
}

cudaError_t launch_to_nchw(const float* x, ActivationDims d, float* nchw, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total <= 0) return cudaSuccess;
  nchw_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, d, nchw, true);
  return cudaGetLastError();
}

cudaError_t launch_from_nchw(const float* nchw, ActivationDims d, float* y, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total <= 0) return cudaSuccess;
  nchw_kernel<<<grid_for(total), kThreads, 0, stream>>>(nchw, d, y, false);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
