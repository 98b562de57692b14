#include "comm/staged_communicator.h"

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include "comm/comm_log.h"

namespace trainer::comm {
namespace {

void* aligned_allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  return p;
}

char* at(void* p, int64_t byte_offset) { return static_cast<char*>(p) + byte_offset; }

}  // namespace

HostAllocator aligned_host_allocator() { return {aligned_allocate, std::free}; }

StagedCommunicator::StagedCommunicator(Communicator& host, models::DeviceMemory& memory, HostAllocator allocator,
                                       bool every_rank)
    : host_(&host), memory_(memory), allocator_(allocator), every_rank_(every_rank) {
  if (!allocator_.allocate || !allocator_.release) allocator_ = aligned_host_allocator();
}

StagedCommunicator::~StagedCommunicator() {
  memory_.synchronize();  // no copy may still read or write a block
  release(collective_);
  for (Pending& p : table_) release(p.block);
}

void* StagedCommunicator::reserve(Block& block, size_t bytes) {
  if (bytes <= block.bytes) return block.data;
  // Every staged call waits for its copies before returning, so nothing reads the old block now.
  release(block);
  block.data = allocator_.allocate(bytes);
  block.bytes = bytes;
  return block.data;
}

void StagedCommunicator::release(Block& block) {
  if (block.data) allocator_.release(block.data);
  block = Block{};
}

int64_t StagedCommunicator::staging_bytes() const {
  int64_t total = static_cast<int64_t>(collective_.bytes);
  for (const Pending& p : table_) total += static_cast<int64_t>(p.block.bytes);
  return total;
}

int64_t StagedCommunicator::start() {
  CommLog& l = host_->log();
  if (!l.active()) return 0;
  // The buffer is produced by work queued before this call (the backward pass): wait for it before
  // the clock starts. Without timing, the copy to the host below waits for it anyway.
  memory_.synchronize();
  return l.now_us();
}

void StagedCommunicator::finish(const char* tag, OpKind kind, int64_t size_bytes, int64_t sent, int64_t received,
                                int64_t t0) {
  CommLog& l = host_->log();
  l.record(tag, kind, size_bytes, sent, received, -1, t0, l.active() ? l.now_us() : 0, every_rank_);
}

// Each collective: device -> staging (and wait), the host call on the staging buffer with the log
// paused (this call's record is written by finish(), with the copies inside its time), staging ->
// device (and wait: the next call may reuse the buffer, and the record's end is when the data is
// back on the device).

void StagedCommunicator::allreduce(void* buffer, int64_t count, DType type, ReduceOp op, const char* tag) {
  const int64_t t0 = start();
  const int64_t b = count * dtype_size(type);
  void* h = reserve(collective_, static_cast<size_t>(b));
  memory_.copy_to_host(h, buffer, b);
  memory_.synchronize();
  {
    CommLog::Pause pause(host_->log());
    host_->allreduce(h, count, type, op, tag);
  }
  memory_.copy_to_device(buffer, h, b);
  memory_.synchronize();
  finish(tag, OpKind::kAllreduce, b, b, b, t0);
}

void StagedCommunicator::allgather(const void* send, int64_t count, void* recv, DType type, const char* tag) {
  const int64_t t0 = start();
  const int64_t es = dtype_size(type), block = count * es, total = block * size();
  void* h = reserve(collective_, static_cast<size_t>(total));
  // In place in the staging buffer: this rank's block is its own part of the output.
  memory_.copy_to_host(at(h, rank() * block), send, block);
  memory_.synchronize();
  {
    CommLog::Pause pause(host_->log());
    host_->allgather(at(h, rank() * block), count, h, type, tag);
  }
  memory_.copy_to_device(recv, h, total);
  memory_.synchronize();
  finish(tag, OpKind::kAllgather, total, block, total - block, t0);
}

void StagedCommunicator::allgatherv(const void* send, int64_t send_count, void* recv,
                                    const std::vector<int64_t>& recv_counts, DType type, const char* tag) {
  if (static_cast<int>(recv_counts.size()) != size() || recv_counts[rank()] != send_count) {
    throw std::invalid_argument("allgatherv " + std::string(tag) + ": recv_counts must have one entry per rank (" +
                                std::to_string(size()) + ") and this rank's entry must equal send_count");
  }
  const int64_t t0 = start();
  const int64_t es = dtype_size(type);
  int64_t offset = 0, total = 0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) offset = total;
    total += recv_counts[r];
  }
  void* h = reserve(collective_, static_cast<size_t>(total * es));
  memory_.copy_to_host(at(h, offset * es), send, send_count * es);
  memory_.synchronize();
  {
    CommLog::Pause pause(host_->log());
    host_->allgatherv(at(h, offset * es), send_count, h, recv_counts, type, tag);
  }
  memory_.copy_to_device(recv, h, total * es);
  memory_.synchronize();
  finish(tag, OpKind::kAllgatherv, total * es, send_count * es, (total - send_count) * es, t0);
}

void StagedCommunicator::alltoall(const void* send, int64_t count, void* recv, DType type, const char* tag) {
  const int64_t t0 = start();
  const int64_t block = count * dtype_size(type), whole = block * size();
  // Send blocks, then receive blocks: the host call needs two buffers that do not overlap.
  void* h = reserve(collective_, static_cast<size_t>(2 * whole));
  memory_.copy_to_host(h, send, whole);
  memory_.synchronize();
  {
    CommLog::Pause pause(host_->log());
    host_->alltoall(h, count, at(h, whole), type, tag);
  }
  memory_.copy_to_device(recv, at(h, whole), whole);
  memory_.synchronize();
  finish(tag, OpKind::kAlltoall, whole, whole - block, whole - block, t0);
}

void StagedCommunicator::broadcast(void* buffer, int64_t count, DType type, int root, const char* tag) {
  const int64_t t0 = start();
  const int64_t b = count * dtype_size(type);
  const bool is_root = rank() == root;
  void* h = reserve(collective_, static_cast<size_t>(b));
  if (is_root) {
    memory_.copy_to_host(h, buffer, b);
    memory_.synchronize();
  }
  {
    CommLog::Pause pause(host_->log());
    host_->broadcast(h, count, type, root, tag);
  }
  if (!is_root) {  // the root's buffer already holds the data
    memory_.copy_to_device(buffer, h, b);
    memory_.synchronize();
  }
  finish(tag, OpKind::kBroadcast, b, is_root ? b : 0, is_root ? 0 : b, t0);
}

void StagedCommunicator::abort(int exit_code) {
  host_->abort(exit_code);
  std::_Exit(exit_code);  // the host's abort does not return; this keeps the promise if it ever did
}

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> sub = host_->split(color, key);
  if (!sub) return nullptr;
  auto staged = std::make_unique<StagedCommunicator>(*sub, memory_, allocator_, false);
  staged->owned_host_ = std::move(sub);
  return staged;
}

std::unique_ptr<Communicator> StagedCommunicator::on_stream(models::DeviceStream& stream) {
  return std::make_unique<StagedCommunicator>(*host_, stream, allocator_, every_rank_);
}

Request StagedCommunicator::isend(const void* buffer, int64_t count, DType type, int peer, int channel,
                                  const char* tag) {
  return post(true, const_cast<void*>(buffer), count, type, peer, channel, tag);
}

Request StagedCommunicator::irecv(void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) {
  return post(false, buffer, count, type, peer, channel, tag);
}

Request StagedCommunicator::post(bool send, void* buffer, int64_t count, DType type, int peer, int channel,
                                 const char* tag) {
  size_t id = 0;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = table_.size();
    table_.emplace_back();
  }
  Pending& p = table_[id];
  p.bytes = static_cast<size_t>(count * dtype_size(type));
  p.device = buffer;
  p.send = send;
  void* h = reserve(p.block, p.bytes);
  // Both directions copy the device buffer out first (a receive: see irecv in the header).
  memory_.copy_to_host(h, buffer, p.bytes);
  memory_.synchronize();
  p.host = send ? host_->isend(h, count, type, peer, channel, tag) : host_->irecv(h, count, type, peer, channel, tag);
  p.busy = true;
  return Request{static_cast<int64_t>(id)};
}

void StagedCommunicator::unstage(size_t id) {
  Pending& p = table_[id];
  if (!p.send) memory_.copy_to_device(p.device, p.block.data, p.bytes);
  p.busy = false;
  free_.push_back(id);
}

Completion StagedCommunicator::wait_completion(Request& request) {
  if (request.id < 0) return {};
  Pending& p = table_.at(static_cast<size_t>(request.id));
  if (!p.busy) throw std::logic_error("wait on a request that is not pending");
  const Completion done = host_->wait_completion(p.host);
  unstage(static_cast<size_t>(request.id));
  memory_.synchronize();
  request.id = -1;
  return done;
}

void StagedCommunicator::wait_all(std::vector<Request>& requests) {
  // The host communicator completes (and logs) them all, each at its own completion time.
  host_requests_.clear();
  for (const Request& r : requests) {
    if (r.id < 0) continue;
    Pending& p = table_.at(static_cast<size_t>(r.id));
    if (!p.busy) throw std::logic_error("wait on a request that is not pending");
    host_requests_.push_back(p.host);
  }
  host_->wait_all(host_requests_);
  for (Request& r : requests) {
    if (r.id >= 0) unstage(static_cast<size_t>(r.id));
    r.id = -1;
  }
  memory_.synchronize();
}

}  // namespace trainer::comm
