// The sum of one double per thread over a block of kBlockThreads threads, in a fixed tree order
// (so the result depends on the launch shape only, never on timing); every thread gets it. For
// the reductions that must repeat bit for bit (.cu files only).
#pragma once

#include <cuda_runtime.h>

namespace trainer::models::cuda {

template <int kBlockThreads>
__device__ double block_sum(double v) {
  __shared__ double shared[kBlockThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kBlockThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // the next call overwrites the array
  return total;
}

}  // namespace trainer::models::cuda
