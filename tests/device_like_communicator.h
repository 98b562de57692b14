// What a sync on the device-like CPU (device_like_backend.h) talks through: MPI staged through host
// copies of the device buffers (comm/staged_communicator.h), as a GPU run without NCCL does
// (make_sync_communicator in trainer/experiment.cpp). Handing such a sync the MPI world itself would
// give MPI device pointers, which it cannot read on a GPU and cannot read here either (the memory
// is guarded). The staging copies go through the guarded memory, not the counting one
// (device.memory): they are the communicator's, as NCCL's transfers would be, not the method's
// copies, which the tests count.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "device_like_backend.h"

namespace trainer::testing {

inline std::unique_ptr<comm::Communicator> device_like_communicator(models::DeviceLikeCpu& device) {
  return std::make_unique<comm::StagedCommunicator>(comm::world(), device.guarded);
}

}  // namespace trainer::testing
