#include "comm/cuda/pinned_host.h"

#include <cuda_runtime.h>

#include <new>

namespace trainer::comm {
namespace {

void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();  // a failed allocation is not a sticky error; clear it for the next call
    throw std::bad_alloc();
  }
  return p;
}

void pinned_release(void* p) { cudaFreeHost(p); }

}  // namespace

HostAllocator pinned_host_allocator() { return {pinned_allocate, pinned_release}; }

}  // namespace trainer::comm
