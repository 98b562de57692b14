// Kernels of the CUDA device (fill.cu), callable from plain C++.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::models::cuda {

// y[0, n) = value on `stream`; returns the launch status.
cudaError_t launch_fill(int64_t n, float value, float* y, cudaStream_t stream);

}  // namespace trainer::models::cuda
