#include "comm/device_communicator.h"

#include <stdexcept>

#include "comm/staged_communicator.h"
#include "models/device_memory.h"
#ifdef TRAINER_HAS_CUDA
#include "comm/cuda/nccl_communicator.h"
#include "comm/cuda/pinned_host.h"
#endif

namespace trainer::comm {

SyncCommunicator make_sync_communicator(const std::string& choice, Communicator& world, models::DeviceMemory& memory) {
  if (choice != "auto" && choice != "nccl" && choice != "mpi")
    throw std::invalid_argument("runtime.communicator = \"" + choice + "\": expected auto, nccl or mpi");
  if (memory.is_host()) {
    if (choice == "nccl")
      throw std::invalid_argument("runtime.communicator = \"nccl\" needs device buffers (runtime.device = \"cuda\")");
    return {nullptr, "mpi (host buffers)"};
  }
  HostAllocator staging = aligned_host_allocator();
  std::string kind = "host staging", why = "runtime.communicator = \"mpi\"";
#ifdef TRAINER_HAS_CUDA
  // Pinned memory is CUDA's to give, and only worth it for CUDA's copies (in this build, device
  // memory is CUDA's).
  if (!memory.is_host()) {
    staging = pinned_host_allocator();
    kind = "pinned host staging";
  }
  if (choice != "mpi") {
    const std::string reason = nccl_unavailable_reason(world, memory);  // the same on every rank
    if (reason.empty())
      return {make_nccl_communicator(world, memory), "nccl (every rank has its own GPU)", true};
    if (choice == "nccl") throw std::runtime_error("runtime.communicator = \"nccl\": " + reason);
    why = reason;
  }
#else
  if (choice == "nccl")
    throw std::runtime_error("runtime.communicator = \"nccl\": this trainer was built without CUDA (cmake -DTRAINER_CUDA=ON)");
  why = "built without NCCL";
#endif
  return {std::make_unique<StagedCommunicator>(world, memory, staging), "mpi through " + kind + " (" + why + ")"};
}

}  // namespace trainer::comm
