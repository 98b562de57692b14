// A Communicator for device buffers that moves them through host memory: every call copies the
// device data into a host staging buffer on the device's stream, runs the host communicator's call
// (MPI) on it, and copies the result back. It is what carries a multi-rank GPU job when NCCL cannot
// (NCCL refuses two ranks on one GPU; a build without NCCL), and it is generic over DeviceMemory, so
// over the CPU's host memory (copies are memcpy) it runs and is tested anywhere (staged_comm_test).
//
// Logging: each call is one record in the host communicator's log, with exactly the op tag, kind,
// sizes and peer the MPI communicator gives it. A collective's time covers the copy to the host, the
// MPI call and the copy back, because that is what the collective costs a step on this path (and
// what an NCCL collective's time also covers: it reads and writes device memory); it starts after
// the device finished the work queued before the call (the backward pass that produced the buffer),
// so compute is never counted as communication. Point-to-point records are the host communicator's
// own (post to completion); the copy before a send and after a receive are outside them.
//
// Not for host buffers: the CPU run keeps the plain MPI communicator (the copies would only cost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "models/device_memory.h"

namespace trainer::comm {

// How staging memory is allocated: plain aligned host memory by default; page-locked (pinned)
// memory with CUDA (comm/cuda/pinned_host.h), which the GPU copies at full speed and asynchronously.
struct HostAllocator {
  void* (*allocate)(size_t bytes) = nullptr;  // throws std::bad_alloc
  void (*release)(void* p) = nullptr;
};
HostAllocator aligned_host_allocator();

class StagedCommunicator final : public Communicator {
 public:
  // `host`: the communicator that moves host memory (MPI), outliving this one; `memory`: where the
  // buffers passed to this one live. `every_rank`: `host` spans every rank of the job (false for a
  // split communicator; see CommLog::record).
  StagedCommunicator(Communicator& host, models::DeviceMemory& memory, HostAllocator allocator = aligned_host_allocator(),
                     bool every_rank = true);
  ~StagedCommunicator() override;
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_size() const override { return host_->local_size(); }
  int local_rank() const override { return host_->local_rank(); }
  CommLog& log() override { return host_->log(); }
  Communicator& host_side() override { return *host_; }

  void allreduce(void* buffer, int64_t count, DType type, ReduceOp op, const char* tag) override;
  void allgather(const void* send, int64_t count, void* recv, DType type, const char* tag) override;
  void allgatherv(const void* send, int64_t send_count, void* recv, const std::vector<int64_t>& recv_counts, DType type,
                  const char* tag) override;
  void alltoall(const void* send, int64_t count, void* recv, DType type, const char* tag) override;
  void broadcast(void* buffer, int64_t count, DType type, int root, const char* tag) override;
  void barrier(const char* tag) override { host_->barrier(tag); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  // The same staging over `stream`: its copies and waits on that stream (the host communicator's calls
  // are then made by the thread that calls it: bucket_reducer.h's communication thread).
  std::unique_ptr<Communicator> on_stream(models::DeviceStream& stream) override;

  // A send copies the message to its own staging block before posting it. A receive first copies
  // the device buffer's current contents to its block, so that copying the whole block back after
  // the wait leaves the bytes past a shorter message as they were (what MPI does to a host buffer)
  // without knowing, in wait_all, how much arrived.
  Request isend(const void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override;
  Request irecv(void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override;
  void wait(Request& request) override { wait_completion(request); }
  Completion wait_completion(Request& request) override;
  void wait_all(std::vector<Request>& requests) override;

  [[noreturn]] void abort(int exit_code) override;

  // Bytes of host staging memory held (it only grows): for tests and --dry-run.
  int64_t staging_bytes() const;

 private:
  // Host memory that only grows; growing waits for the stream (a copy from the old block may be queued).
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void* reserve(Block& block, size_t bytes);
  void release(Block& block);
  // The timer, started once the device has finished what was queued before the call.
  int64_t start();
  void finish(const char* tag, OpKind kind, int64_t size_bytes, int64_t sent, int64_t received, int64_t t0);
  Request post(bool send, void* buffer, int64_t count, DType type, int peer, int channel, const char* tag);
  // After a receive completed: its block back to the device (the whole capacity, see irecv).
  void unstage(size_t id);

  Communicator* host_;
  std::unique_ptr<Communicator> owned_host_;  // a split's host communicator
  models::DeviceMemory& memory_;
  HostAllocator allocator_;
  bool every_rank_;
  Block collective_;  // one staging buffer for all collectives (they are blocking)
  struct Pending {
    Request host;
    Block block;  // kept with the slot, so a reused slot reuses its memory
    void* device = nullptr;
    size_t bytes = 0;  // posted capacity
    bool send = false, busy = false;
  };
  std::vector<Pending> table_;  // Request.id indexes it; finished slots are reused
  std::vector<size_t> free_;
  std::vector<Request> host_requests_;  // scratch for wait_all
};

}  // namespace trainer::comm
