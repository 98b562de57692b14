// The Communicator over NCCL for device buffers, when every rank of the job has its own GPU (NCCL
// refuses two ranks on one GPU). Compiled only with cmake -DTRAINER_CUDA=ON; not yet run on a GPU
// (docs/architecture.md, section 3, lists what a GPU session must check).
//
// allreduce, allgather and broadcast are NCCL's, enqueued on the device's own stream
// (DeviceMemory::stream_handle) in order with the compute ops, so a call returns without waiting.
// What NCCL does not have with MPI's meaning (allgatherv, alltoall, point to point, split) goes
// through the staged path (comm/staged_communicator.h) on the same stream; barrier is MPI's.
//
// Logging is the MPI communicator's: the same op tags, kinds and bytes. While the log times calls
// (CommLog::active), each NCCL call is bracketed by two CUDA events on the stream and waits for the
// second one (that event, not the device): the record's duration is the events' elapsed time, and
// it ends when the host saw the second event complete. Without timing nothing waits.
//
// on_stream gives the same NCCL communicator on a second stream (sync.overlap's dense buckets,
// comm/sync/methods/dense/bucket_reducer.h). There a timed call is not waited for (the training thread enqueues
// it during backward): it keeps its two events, and complete_records() writes the records in call
// order, each placed on the host clock by its elapsed time to the last call's end, the one event
// it waits for.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "models/device_memory.h"

namespace trainer::comm {

// Why NCCL cannot carry this job's device buffers, or "" when it can: two ranks use the same GPU
// (by UUID), or `memory` exposes no stream. Collective over `world` (an allgather of every rank's
// GPU), so every rank gets the same answer.
std::string nccl_unavailable_reason(Communicator& world, models::DeviceMemory& memory);

// One NCCL communicator over the ranks of `world` (ncclCommInitRank, the unique id broadcast over
// `world`); records into world's log. Collective over `world`. Throws std::runtime_error with
// NCCL's message when NCCL cannot start.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& world, models::DeviceMemory& memory);

}  // namespace trainer::comm
