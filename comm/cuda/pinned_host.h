// Page-locked (pinned) host memory for staging device buffers: the GPU copies it by DMA at full
// speed, and a cudaMemcpyAsync from or to it does not block the host (from pageable memory the
// driver copies through a pinned bounce buffer of its own, synchronously). Compiled only with
// cmake -DTRAINER_CUDA=ON.
#pragma once

#include "comm/staged_communicator.h"

namespace trainer::comm {

// cudaHostAlloc / cudaFreeHost; allocate throws std::bad_alloc when the memory cannot be pinned.
HostAllocator pinned_host_allocator();

}  // namespace trainer::comm
