// The communicator that carries the gradient sync's collectives (runtime.communicator): the one
// place that chooses between MPI on host buffers, NCCL on device buffers and MPI with host staging
// (docs/architecture.md, section 3). Called once per run, by build_experiment.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "models/device_memory.h"

namespace trainer::comm {

struct SyncCommunicator {
  // The communicator for buffers in the memory asked about; null when `world` itself serves (host
  // memory: the CPU run keeps the plain MPI communicator).
  std::unique_ptr<Communicator> device;
  std::string description;  // one line: which, and why (for the run's announcement)
  // The collectives are enqueued on the device's stream (NCCL), so a CUDA graph can record them;
  // false for host staging, whose MPI calls wait for the device.
  bool on_device = false;
};

// `choice`: runtime.communicator ("auto", "nccl" or "mpi"); `memory`: where the sync buffers live.
// Host memory: `world`. Device memory: NCCL when asked ("nccl") or possible ("auto": a build with
// CUDA, and every rank of the job has its own GPU, by UUID over `world`), else MPI through a pinned
// host staging buffer (StagedCommunicator). Collective over `world` for device memory. Throws
// std::runtime_error naming runtime.communicator when "nccl" is asked for and cannot be had.
SyncCommunicator make_sync_communicator(const std::string& choice, Communicator& world, models::DeviceMemory& memory);

}  // namespace trainer::comm
