// The part of CUDA our kernels use, emulated on the host, so that models/cuda/*.cu can run on a
// machine without a GPU (scripts/cuda_emulation/run.sh). Each block's threads are std::threads;
// __syncthreads is a barrier of the block, a warp shuffle one of its 32 threads; __shared__ is a
// function-local static (the blocks of a launch run one after another). Launches run to completion
// before they return, in issue order, as on one stream. Grid-stride kernels get at most a few
// blocks (their loops cover the rest, which exercises the striding); other kernels get their whole
// grid (emulate.py decides which is which).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
enum cudaError_t { cudaSuccess = 0 };
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error (emulated)"; }
// CUDA's math API has these in the global namespace.
using std::isfinite;
using std::isnan;
// The explicitly rounded float intrinsics (no contraction across them): each is one IEEE operation.
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }

// Copies run at once, in issue order, as the launches do (the one stream).
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  if (bytes) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(x)

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace cuda_emulation {
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::barrier<>*> warp_barriers;
inline float shuffled[1024];
inline unsigned thread_in_block() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::block_barrier->arrive_and_wait(); }

// Every lane of the warp calls it with the same offset, as on a GPU.
inline float __shfl_down_sync(unsigned, float v, int offset) {
  using namespace cuda_emulation;
  const unsigned t = thread_in_block(), lane = t % 32;
  std::barrier<>& warp = *warp_barriers[t / 32];
  shuffled[t] = v;
  warp.arrive_and_wait();
  const float result = lane + offset < 32 ? shuffled[t + offset] : v;
  warp.arrive_and_wait();
  return result;
}

// Integer atomics (the radix select's histogram, batch norm's tickets): the block's threads run
// concurrently here too.
inline int atomicAdd(int* address, int value) { return std::atomic_ref<int>(*address).fetch_add(value); }
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_add(value);
}
// Device-wide memory operations (batch norm's last-block-done finish). The blocks of a launch run
// one after another here, so these only have to be correct, not to order anything across blocks.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
T __ldcg(const T* p) {  // a load that bypasses L1 on a GPU
  return *p;
}

// Every lane of the warp calls it, as on a GPU (the mask is always the full warp in our kernels).
inline unsigned __ballot_sync(unsigned, bool predicate) {
  using namespace cuda_emulation;
  const unsigned t = thread_in_block(), warp = t / 32;
  std::barrier<>& barrier = *warp_barriers[warp];
  shuffled[t] = predicate ? 1.f : 0.f;
  barrier.arrive_and_wait();
  const unsigned lanes = std::min(32u, blockDim.x * blockDim.y * blockDim.z - warp * 32);
  unsigned bits = 0;
  for (unsigned lane = 0; lane < lanes; ++lane)
    if (shuffled[warp * 32 + lane] != 0.f) bits |= 1u << lane;
  barrier.arrive_and_wait();
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }

template <class Kernel, class... Args>
cudaError_t emulated_launch(bool whole_grid, dim3 grid, dim3 block, Kernel kernel, Args... args) {
  using namespace cuda_emulation;
  static const unsigned cap = std::getenv("CUDA_EMULATION_BLOCKS") ? std::atoi(std::getenv("CUDA_EMULATION_BLOCKS")) : 3;
  if (!whole_grid) grid.x = std::min(grid.x, cap);
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> barrier(threads);
        block_barrier = &barrier;
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        warp_barriers.clear();
        for (unsigned w = 0; w * 32 < threads; ++w) {
          warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - w * 32)));
          warp_barriers.push_back(warps.back().get());
        }
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            blockIdx = dim3(bx, by, bz);
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            kernel(args...);
            // A thread that is done leaves the barriers, so the others never wait for it.
            barrier.arrive_and_drop();
            warp_barriers[t / 32]->arrive_and_drop();
          });
        for (auto& thread : pool) thread.join();
      }
  return cudaSuccess;
}
