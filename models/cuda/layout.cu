// Activations in their layout <-> PyTorch's NCHW order (Flatten before a Linear, exports), and
// convolution filters in PyTorch's {O, I, KH, KW} <-> channels-last {O, KH, KW, I} (cudnn_conv.cpp).
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

// Index i runs over {O, KH, KW, I} order; `to` says which side that is.
__global__ void filter_kernel(const float* src, int64_t n_out, int64_t n_in, int64_t kh, int64_t kw, float* dst,
                              bool to_channels_last) {
  const int64_t total = n_out * n_in * kh * kw;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % n_in, s = (i / n_in) % kw, r = (i / (n_in * kw)) % kh, o = i / (n_in * kw * kh);
    const int64_t oihw = ((o * n_in + c) * kh + r) * kw + s;
    if (to_channels_last) dst[i] = src[oihw];
    else dst[oihw] = src[i];
  }
}

}  // namespace

cudaError_t launch_filter_to_channels_last(const float* oihw, int64_t n_out, int64_t n_in, int64_t kh, int64_t kw,
                                           float* ohwi, cudaStream_t stream) {
  const int64_t total = n_out * n_in * kh * kw;
  if (total <= 0) return cudaSuccess;
  filter_kernel<<<grid_for(total), kThreads, 0, stream>>>(oihw, n_out, n_in, kh, kw, ohwi, true);
  return cudaGetLastError();
}

cudaError_t launch_filter_from_channels_last(const float* ohwi, int64_t n_out, int64_t n_in, int64_t kh, int64_t kw,
                                             float* oihw, cudaStream_t stream) {
  const int64_t total = n_out * n_in * kh * kw;
  if (total <= 0) return cudaSuccess;
  filter_kernel<<<grid_for(total), kThreads, 0, stream>>>(ohwi, n_out, n_in, kh, kw, oihw, false);
  return cudaGetLastError();
}

ActivationDims dims_of(const Tensor& t) {
  ActivationDims d;
  d.n = t.dim(0);
  d.c = t.dim(1);
  d.h = t.rank() > 2 ? t.dim(2) : 1;
  d.w = t.rank() > 3 ? t.dim(3) : 1;
  d.block = channel_block(t.layout);
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
