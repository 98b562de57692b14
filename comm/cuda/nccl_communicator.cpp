#include "comm/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm_log.h"
#include "comm/cuda/pinned_host.h"
#include "comm/staged_communicator.h"

namespace trainer::comm {
namespace {

void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(status));
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
    // The wire formats (wire_format.h): NCCL reduces them in the format itself, as our MPI reduction
    // does (partial sums travel between ranks as 16-bit numbers).
    case DType::kF16: return ncclFloat16;
    case DType::kBF16:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclBfloat16;
#else
      throw std::runtime_error("NCCL before 2.10 has no bfloat16 (sync.wire_dtype = \"bf16\")");
#endif
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& world, models::DeviceMemory& memory)
      : world_(world),
        stream_(static_cast<cudaStream_t>(memory.stream_handle())),
        staged_(world, memory, pinned_host_allocator()) {
    if (!stream_) throw std::runtime_error("NCCL: the device memory exposes no CUDA stream");
    ncclUniqueId id{};
    if (world.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    {
      CommLog::Pause setup(world.log());  // start-up traffic, not the run's
      world.broadcast(&id, sizeof id, DType::kU8, 0, "NCCL_UNIQUE_ID");
    }
    check(ncclCommInitRank(&comm_, world.size(), id, world.rank()), "ncclCommInitRank");
    // Timing only: no blocking-sync flag, so waiting on an event spins briefly instead of sleeping.
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&end_), "cudaEventCreate");
  }

  // The same NCCL communicator on a second stream (on_stream): the calls of overlapped dense buckets.
  // Its timed calls are not waited for (that would block the training thread that enqueues them,
  // and with it the compute stream): each keeps its two events, and complete_records() reads them.
  NcclCommunicator(NcclCommunicator& parent, models::DeviceStream& stream)
      : world_(parent.world_),
        stream_(static_cast<cudaStream_t>(stream.stream_handle())),
        staged_(parent.world_, stream, pinned_host_allocator()),
        comm_(parent.comm_),
        owns_comm_(false),
        defer_timing_(true) {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&end_), "cudaEventCreate");
  }

  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);  // no NCCL kernel may still use the communicator
    if (owns_comm_) ncclCommDestroy(comm_);
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
    for (Deferred& d : deferred_) {
      cudaEventDestroy(d.start);
      cudaEventDestroy(d.end);
    }
  }

  std::unique_ptr<Communicator> on_stream(models::DeviceStream& stream) override {
    return std::make_unique<NcclCommunicator>(*this, stream);
  }
  bool enqueues() const override { return true; }

  // Each deferred call's end relative to the last one's, which the host waits for: the events'
  // elapsed times place every call on the host clock without a wait per call.
  void complete_records() override {
    if (pending_ == 0) return;
    CommLog& l = world_.log();
    const Deferred& last = deferred_[pending_ - 1];
    check(cudaEventSynchronize(last.end), "cudaEventSynchronize");
    const int64_t now = l.now_us();
    for (size_t i = 0; i < pending_; ++i) {
      const Deferred& d = deferred_[i];
      float to_last = 0, duration = 0;
      check(cudaEventElapsedTime(&to_last, d.end, last.end), "cudaEventElapsedTime");
      check(cudaEventElapsedTime(&duration, d.start, d.end), "cudaEventElapsedTime");
      const int64_t t_end = now - static_cast<int64_t>(to_last * 1000.0 + 0.5);
      l.set_ready(d.ready_us);
      l.record(d.tag, d.kind, d.size_bytes, d.sent, d.received, -1,
               t_end - static_cast<int64_t>(duration * 1000.0 + 0.5), t_end, true);
    }
    pending_ = 0;
  }

  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  int local_size() const override { return world_.local_size(); }
  int local_rank() const override { return world_.local_rank(); }
  CommLog& log() override { return world_.log(); }
  Communicator& host_side() override { return world_; }

  void allreduce(void* buffer, int64_t count, DType type, ReduceOp op, const char* tag) override {
    const bool timed = begin();
    check(ncclAllReduce(buffer, buffer, static_cast<size_t>(count), nccl_type(type), nccl_op(op), comm_, stream_),
          "ncclAllReduce");
    const int64_t b = count * dtype_size(type);
    end(timed, tag, OpKind::kAllreduce, b, b, b);
  }

  void allgather(const void* send, int64_t count, void* recv, DType type, const char* tag) override {
    // NCCL's allgather is in place exactly when send is this rank's block of recv, as ours.
    const int64_t es = dtype_size(type), total = count * size();
    const bool timed = begin();
    check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(type), comm_, stream_), "ncclAllGather");
    end(timed, tag, OpKind::kAllgather, total * es, count * es, (total - count) * es);
  }

  void broadcast(void* buffer, int64_t count, DType type, int root, const char* tag) override {
    const int64_t b = count * dtype_size(type);
    const bool timed = begin();
    check(ncclBroadcast(buffer, buffer, static_cast<size_t>(count), nccl_type(type), root, comm_, stream_),
          "ncclBroadcast");
    end(timed, tag, OpKind::kBroadcast, b, rank() == root ? b : 0, rank() == root ? 0 : b);
  }

  // NCCL has no allgatherv or alltoall of MPI's kind (ncclGroup of sends/receives could make them;
  // nothing on device buffers uses them yet): the staged path, logged the same way.
  void allgatherv(const void* send, int64_t send_count, void* recv, const std::vector<int64_t>& recv_counts,
                  DType type, const char* tag) override {
    staged_.allgatherv(send, send_count, recv, recv_counts, type, tag);
  }
  void alltoall(const void* send, int64_t count, void* recv, DType type, const char* tag) override {
    staged_.alltoall(send, count, recv, type, tag);
  }
  void barrier(const char* tag) override { world_.barrier(tag); }
  std::unique_ptr<Communicator> split(int color, int key) override { return staged_.split(color, key); }
  Request isend(const void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override {
    return staged_.isend(buffer, count, type, peer, channel, tag);
  }
  Request irecv(void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override {
    return staged_.irecv(buffer, count, type, peer, channel, tag);
  }
  void wait(Request& request) override { staged_.wait(request); }
  Completion wait_completion(Request& request) override { return staged_.wait_completion(request); }
  void wait_all(std::vector<Request>& requests) override { staged_.wait_all(requests); }

  [[noreturn]] void abort(int exit_code) override {
    world_.abort(exit_code);
    std::_Exit(exit_code);
  }

 private:
  // A timed call's events kept until complete_records() (a second stream's calls).
  struct Deferred {
    cudaEvent_t start = nullptr, end = nullptr;
    const char* tag = "";
    OpKind kind = OpKind::kOther;
    int64_t size_bytes = 0, sent = 0, received = 0, ready_us = -1;
  };

  // True when this call is timed: then its start event is recorded on the stream.
  bool begin() {
    if (!world_.log().active()) return false;
    if (defer_timing_) {
      if (pending_ == deferred_.size()) {
        Deferred d;
        check(cudaEventCreate(&d.start), "cudaEventCreate");
        check(cudaEventCreate(&d.end), "cudaEventCreate");
        deferred_.push_back(d);
      }
      check(cudaEventRecord(deferred_[pending_].start, stream_), "cudaEventRecord");
      return true;
    }
    check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    return true;
  }

  void end(bool timed, const char* tag, OpKind kind, int64_t size_bytes, int64_t sent, int64_t received) {
    CommLog& l = world_.log();
    int64_t t_start = 0, t_end = 0;
    if (timed && defer_timing_) {
      Deferred& d = deferred_[pending_++];
      check(cudaEventRecord(d.end, stream_), "cudaEventRecord");
      d.tag = tag;
      d.kind = kind;
      d.size_bytes = size_bytes;
      d.sent = sent;
      d.received = received;
      d.ready_us = l.take_ready();
      return;
    }
    if (timed) {
      check(cudaEventRecord(end_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(end_), "cudaEventSynchronize");
      t_end = l.now_us();
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start_, end_), "cudaEventElapsedTime");
      t_start = t_end - static_cast<int64_t>(ms * 1000.0 + 0.5);
    }
    l.record(tag, kind, size_bytes, sent, received, -1, t_start, t_end, true);
  }

  Communicator& world_;
  cudaStream_t stream_;
  StagedCommunicator staged_;
  ncclComm_t comm_ = nullptr;
  bool owns_comm_ = true;
  bool defer_timing_ = false;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  std::vector<Deferred> deferred_;  // grows to the most calls of one step; the first pending_ are in flight
  size_t pending_ = 0;
};

}  // namespace

std::string nccl_unavailable_reason(Communicator& world, models::DeviceMemory& memory) {
  // Every rank's GPU by its UUID (the device `memory` made current), and whether it has a stream.
  // UUIDs identify GPUs across nodes, and also when each rank sees only its own GPU (a scheduler's
  // CUDA_VISIBLE_DEVICES per rank), where counting visible GPUs per node would say no.
  constexpr int64_t kEntry = 17;
  std::vector<unsigned char> mine(kEntry, 0), all(kEntry * world.size());
  int device = -1;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&properties, device) == cudaSuccess) {
    std::memcpy(mine.data(), properties.uuid.bytes, 16);
  } else {
    cudaGetLastError();
  }
  mine[16] = memory.stream_handle() != nullptr ? 1 : 0;
  {
    CommLog::Pause setup(world.log());  // start-up traffic, not the run's
    world.allgather(mine.data(), kEntry, all.data(), DType::kU8, "NCCL_PROBE");
  }
  for (int r = 0; r < world.size(); ++r)
    for (int s = r + 1; s < world.size(); ++s)
      if (std::memcmp(&all[r * kEntry], &all[s * kEntry], 16) == 0)
        return "ranks " + std::to_string(r) + " and " + std::to_string(s) +
               " share a GPU (NCCL needs one GPU per rank)";
  for (int r = 0; r < world.size(); ++r)
    if (!all[r * kEntry + 16]) return "the CUDA device exposes no stream for NCCL (DeviceMemory::stream_handle)";
  return "";
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& world, models::DeviceMemory& memory) {
  return std::make_unique<NcclCommunicator>(world, memory);
}

}  // namespace trainer::comm
