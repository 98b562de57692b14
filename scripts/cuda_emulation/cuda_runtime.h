// The part of CUDA our kernels use, emulated on the host, so that models/cuda/*.cu can run on a
// machine without a GPU (scripts/cuda_emulation/run.sh). Cooperative: a block's threads are fibers
// (ucontext) on the launching thread, each with a stack of its own; a thread runs until it reaches a
// barrier (__syncthreads: the block's; a warp shuffle or ballot: its warp's) or returns, then the
// next one runs, and a barrier opens once every thread still running has reached it. One OS thread
// and no locks, so a block costs microseconds instead of an OS thread per CUDA thread. The order in
// which threads run alternates (forward, then backward) from one barrier phase to the next, so a
// value read without the barrier that should order it is read before its write in one of the two.
// A barrier that can never open (some threads wait at one the others never reach: divergent
// __syncthreads, a warp split between a shuffle and a block barrier) aborts with the kernel's
// position, where a GPU would hang or be undefined. __shared__ is a function-local static (the
// blocks of a launch run one after another). Launches run to completion before they return, in
// issue order, as on one stream. Grid-stride kernels get at most a few blocks (their loops cover the
// rest, which exercises the striding); other kernels get their whole grid (emulate.py decides which
// is which).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
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
// Sums and products kept out of line, so that GCC (-ffp-contract=fast) cannot fuse one with an
// operation of the caller's into an FMA, as nvcc never does with these.
[[gnu::noinline]] inline float __fadd_rn(float a, float b) { return a + b; }
[[gnu::noinline]] inline float __fsub_rn(float a, float b) { return a - b; }
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// To the nearest integer, ties to even (nearbyint in the default rounding mode).
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }

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

// Per launching thread (its fibers run on it, so they see the launch's): the scheduler sets
// threadIdx before it resumes a thread.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emulation {

// One block's threads and their barriers.
struct Block {
  enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };
  unsigned threads = 0;
  std::vector<State> state;
  std::vector<ucontext_t> context;
  ucontext_t scheduler;
  unsigned current = 0;
  float shuffled[1024];
};
inline thread_local Block* block = nullptr;

inline unsigned thread_in_block() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// The running thread waits at a barrier: back to the scheduler, which resumes it once it opens.
inline void wait(Block::State at) {
  Block& b = *block;
  const unsigned t = b.current;
  b.state[t] = at;
  swapcontext(&b.context[t], &b.scheduler);
}

// Fiber stacks, kept for the next launch (a block has at most 1024 threads). 256 KiB each: kernel
// parameters (HostInts arrays) are copied onto them.
constexpr size_t kStackBytes = size_t(256) << 10;
inline thread_local std::vector<std::unique_ptr<char[]>> stacks;

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::wait(cuda_emulation::Block::kAtBlockBarrier); }

// Every lane of the warp calls it with the same offset, as on a GPU.
inline float __shfl_down_sync(unsigned, float v, int offset) {
  using namespace cuda_emulation;
  const unsigned t = thread_in_block(), lane = t % 32;
  block->shuffled[t] = v;
  wait(Block::kAtWarpBarrier);
  const float result = lane + offset < 32 && t + offset < block->threads ? block->shuffled[t + offset] : v;
  wait(Block::kAtWarpBarrier);
  return result;
}

// Integer atomics (the radix select's histogram, batch norm's tickets): one OS thread runs the
// fibers, so these need no more than a plain read-modify-write; atomic_ref keeps them honest.
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
  block->shuffled[t] = predicate ? 1.f : 0.f;
  wait(Block::kAtWarpBarrier);
  const unsigned lanes = std::min(32u, block->threads - warp * 32);
  unsigned bits = 0;
  for (unsigned lane = 0; lane < lanes; ++lane)
    if (block->shuffled[warp * 32 + lane] != 0.f) bits |= 1u << lane;
  wait(Block::kAtWarpBarrier);
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }

namespace cuda_emulation {

// getcontext out of line: GCC treats it as returning twice (like setjmp), so in the function that
// calls it every local live across the call draws -Wclobbered. Here it returns once only (the
// context it fills is makecontext's starting point, never resumed as saved), and this function has
// nothing live after it.
[[gnu::noinline]] inline void initialize_context(ucontext_t* context) { getcontext(context); }

// A fiber's entry: makecontext passes ints only, so the kernel's call comes through a global.
inline thread_local const std::function<void()>* body = nullptr;
inline void fiber_main() {
  (*body)();
  block->state[block->current] = Block::kDone;
  // Returning ends the fiber: uc_link resumes the scheduler.
}

// Runs one block's threads until all have returned. Barriers open when every thread still running
// waits at them: the block's when all do, a warp's when all of that warp's do.
inline void run_block(unsigned threads, dim3 shape, const std::function<void()>& kernel_call, const char* what) {
  Block b;
  b.threads = threads;
  b.state.assign(threads, Block::kRunnable);
  b.context.resize(threads);
  block = &b;
  body = &kernel_call;
  while (stacks.size() < threads) stacks.push_back(std::make_unique<char[]>(kStackBytes));
  for (unsigned t = 0; t < threads; ++t) {
    initialize_context(&b.context[t]);
    b.context[t].uc_stack.ss_sp = stacks[t].get();
    b.context[t].uc_stack.ss_size = kStackBytes;
    b.context[t].uc_link = &b.scheduler;
    makecontext(&b.context[t], fiber_main, 0);
  }
  bool backward = false;
  for (;;) {
    // A phase: every runnable thread runs to its next barrier or its end.
    for (unsigned i = 0; i < threads; ++i) {
      const unsigned t = backward ? threads - 1 - i : i;
      if (b.state[t] != Block::kRunnable) continue;
      b.current = t;
      threadIdx = dim3(t % shape.x, (t / shape.x) % shape.y, t / (shape.x * shape.y));
      swapcontext(&b.scheduler, &b.context[t]);
    }
    backward = !backward;
    // Open what can open: each warp whose running lanes all wait at its barrier, then the block's.
    bool opened = false, running = false, block_waits = true;
    for (unsigned w = 0; w * 32 < threads; ++w) {
      const unsigned end = std::min(threads, w * 32 + 32);
      bool all_at_warp = true, any = false;
      for (unsigned t = w * 32; t < end; ++t) {
        if (b.state[t] == Block::kDone) continue;
        any = true;
        if (b.state[t] != Block::kAtWarpBarrier) all_at_warp = false;
        if (b.state[t] != Block::kAtBlockBarrier) block_waits = false;
      }
      if (any) running = true;
      if (any && all_at_warp) {
        for (unsigned t = w * 32; t < end; ++t)
          if (b.state[t] == Block::kAtWarpBarrier) b.state[t] = Block::kRunnable;
        opened = true;
      }
    }
    if (!running) break;
    if (!opened && block_waits) {
      for (unsigned t = 0; t < threads; ++t)
        if (b.state[t] == Block::kAtBlockBarrier) b.state[t] = Block::kRunnable;
      opened = true;
    }
    if (!opened) {
      std::fprintf(stderr,
                   "cuda_emulation: %s: block (%u, %u, %u) can never continue: some threads wait at a barrier "
                   "the others do not reach (divergent __syncthreads or warp shuffle)\n",
                   what, blockIdx.x, blockIdx.y, blockIdx.z);
      std::abort();
    }
  }
  block = nullptr;
  body = nullptr;
}

}  // namespace cuda_emulation

template <class Kernel, class... Args>
cudaError_t emulated_launch(bool whole_grid, dim3 grid, dim3 block, Kernel kernel, Args... args) {
  using namespace cuda_emulation;
  static const unsigned cap = std::getenv("CUDA_EMULATION_BLOCKS") ? std::atoi(std::getenv("CUDA_EMULATION_BLOCKS")) : 3;
  if (!whole_grid) grid.x = std::min(grid.x, cap);
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  const std::function<void()> call = [&] { kernel(args...); };
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        run_block(threads, block, call, __PRETTY_FUNCTION__);
      }
  return cudaSuccess;
}
