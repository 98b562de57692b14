// Launch shapes shared by the element-wise kernels (.cu files only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::models::cuda {

constexpr int kThreads = 256;

// Grid-stride loops cover any n; the grid is capped so huge tensors reuse blocks.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < 65535 ? blocks : 65535);
}

__device__ inline int64_t first_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace trainer::models::cuda

#include "models/cuda/kernels.h"

namespace trainer::models::cuda {

// Element (n, c, h, w) of an activation in its layout (the CPU backend's offset(), on the device).
__device__ inline int64_t element_offset(const ActivationDims& d, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (d.block) return (((n * (d.c / d.block) + c / d.block) * d.h + h) * d.w + w) * d.block + c % d.block;
  return ((n * d.h + h) * d.w + w) * d.c + c;
}

}  // namespace trainer::models::cuda
