// Option-A shortcut of the CIFAR ResNets (backend.h): subsample by `stride`, zero-pad `pad` channels
// on each side; backward keeps the gradient of the data channels. Any layout on either side.
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// Index i runs over (n, h, w, c), c fastest: consecutive threads write consecutive channels-last
// addresses.
__global__ void shortcut_forward_kernel(const float* x, ActivationDims xd, int64_t stride, int64_t pad, float* y,
                                        ActivationDims yd) {
  const int64_t total = yd.n * yd.c * yd.h * yd.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % yd.c, j = (i / yd.c) % yd.w, h = (i / (yd.c * yd.w)) % yd.h, n = i / (yd.c * yd.w * yd.h);
    const int64_t src = c - pad;
    y[element_offset(yd, n, c, h, j)] =
        src >= 0 && src < xd.c ? x[element_offset(xd, n, src, h * stride, j * stride)] : 0.f;
  }
}

__global__ void shortcut_backward_kernel(const float* dy, ActivationDims dyd, int64_t stride, int64_t pad, float* dx,
                                         ActivationDims dxd) {
  const int64_t total = dxd.n * dxd.c * dxd.h * dxd.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % dxd.c, j = (i / dxd.c) % dxd.w, h = (i / (dxd.c * dxd.w)) % dxd.h,
                  n = i / (dxd.c * dxd.w * dxd.h);
    dx[element_offset(dxd, n, c, h, j)] =
        h % stride == 0 && j % stride == 0 ? dy[element_offset(dyd, n, c + pad, h / stride, j / stride)] : 0.f;
  }
}

}  // namespace

cudaError_t launch_shortcut_a_forward(const float* x, ActivationDims xd, int64_t stride, int64_t pad, float* y,
                                      ActivationDims yd, cudaStream_t stream) {
  const int64_t total = yd.n * yd.c * yd.h * yd.w;
  if (total <= 0) return cudaSuccess;
  shortcut_forward_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, xd, stride, pad, y, yd);
  return cudaGetLastError();
}

cudaError_t launch_shortcut_a_backward(const float* dy, ActivationDims dyd, int64_t stride, int64_t pad, float* dx,
                                       ActivationDims dxd, cudaStream_t stream) {
  const int64_t total = dxd.n * dxd.c * dxd.h * dxd.w;
  if (total <= 0) return cudaSuccess;
  shortcut_backward_kernel<<<grid_for(total), kThreads, 0, stream>>>(dy, dyd, stride, pad, dx, dxd);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
