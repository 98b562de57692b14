// The Communicator over MPI_COMM_WORLD (and sub-communicators split from it), with MPI's C API.
// Each public call is the MPI call plus one log record; the MPI work itself lives in the raw_* helpers, which also cut 64-bit counts into
// pieces MPI's int counts can carry.
#define OMPI_SKIP_MPICXX 1  // the C API only: no libmpi_cxx
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/open_mpi_defaults.h"
#include "comm/pair_allreduce.h"
#include "comm/wire_format.h"

namespace trainer::comm {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
  }
  return 1;
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
    // MPI has no 16-bit float type: the bits travel as 16-bit integers and our own operations
    // (sixteen_bit_op) reduce them.
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kF16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

bool is_sixteen_bit_float(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The reductions of the 16-bit formats, as MPI user operations (commutative, so MPI may combine in
// any order, as it does for MPI_SUM): each pair is widened to fp32, combined, and a sum rounded
// back to the format (wire_add), which is what NCCL and gloo do for half and bfloat16. max and min
// compare the widened values (exact; NaN handling as std::max/min on floats).
template <WireDType W, ReduceOp Op>
void sixteen_bit_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  if constexpr (Op == ReduceOp::kSum) {
    wire_add(W, a, b, *len);
  } else {
    for (int i = 0; i < *len; ++i) {
      float x = 0, y = 0;
      widen(W, a + i, 1, &x);
      widen(W, b + i, 1, &y);
      if (Op == ReduceOp::kMax ? x > y : x < y) b[i] = a[i];
    }
  }
}

// Made on first use (MPI is initialized by then) and freed before MPI_Finalize.
MPI_Op g_sixteen_bit_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};

MPI_Op sixteen_bit_op(DType t, ReduceOp op) {
  using Fn = void (*)(void*, void*, int*, MPI_Datatype*);
  static const Fn fns[2][3] = {
      {sixteen_bit_reduce<WireDType::kBF16, ReduceOp::kSum>, sixteen_bit_reduce<WireDType::kBF16, ReduceOp::kMax>,
       sixteen_bit_reduce<WireDType::kBF16, ReduceOp::kMin>},
      {sixteen_bit_reduce<WireDType::kF16, ReduceOp::kSum>, sixteen_bit_reduce<WireDType::kF16, ReduceOp::kMax>,
       sixteen_bit_reduce<WireDType::kF16, ReduceOp::kMin>}};
  const int f = t == DType::kBF16 ? 0 : 1, o = static_cast<int>(op);
  MPI_Op& slot = g_sixteen_bit_ops[f][o];
  if (slot == MPI_OP_NULL) MPI_Op_create(fns[f][o], /*commute=*/1, &slot);
  return slot;
}

void free_sixteen_bit_ops() {
  for (auto& row : g_sixteen_bit_ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts and displacements are int. Anything larger is cut into pieces of at most 1 GiB: far
// under INT_MAX elements of any type, and under the 2 GiB byte limit some transports still have.
// A 27.5M-float gradient (110 MB) is one piece.
int64_t g_piece_bytes = int64_t(1) << 30;

// request_concurrent_calls() before MPI_Init, and the level MPI provided (the same for every
// communicator of the process).
bool g_want_multiple = false;
int g_thread_level = MPI_THREAD_SINGLE;
int64_t piece_elems(DType t) { return std::max<int64_t>(1, g_piece_bytes / dtype_size(t)); }

char* at(void* p, int64_t byte_offset) { return static_cast<char*>(p) + byte_offset; }
const char* at(const void* p, int64_t byte_offset) { return static_cast<const char*>(p) + byte_offset; }

// One nonblocking send or receive: possibly several MPI requests (one per piece).
struct Pending {
  std::vector<MPI_Request> requests;
  const char* tag = "";
  DType type = DType::kU8;
  int64_t bytes = 0;     // posted size
  int64_t received = 0;  // receives: what arrived so far
  int peer = -1;          // kAnySource until an any-source receive completes
  int open = 0;          // MPI requests not yet complete
  bool send = false, busy = false;
  int64_t t_start_us = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  // MPI_COMM_WORLD: initializes MPI and owns the process's log.
  MpiCommunicator() : log_(&own_log_) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // SERIALIZED: dense buckets overlapped with backward are reduced on a communication thread
      // while the training thread makes no MPI call (comm/sync/methods/dense/bucket_reducer.h). MULTIPLE lets two
      // threads call at once (on different communicators): diloco's delayed outer allreduce runs on
      // its own thread during the next steps (comm/sync/methods/outer/outer_transfer.h), so the trainer asks for it
      // in such runs (request_concurrent_calls); TRAINER_MPI_THREAD=multiple asks for it always (for
      // measuring its cost: Open MPI then takes a lock around every call).
      set_open_mpi_defaults();
      const char* level = std::getenv("TRAINER_MPI_THREAD");
      const bool multiple = g_want_multiple || (level && std::string(level) == "multiple");
      const int wanted = multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, wanted, &provided);
      g_thread_level = provided;
      if (provided < MPI_THREAD_SERIALIZED)
        throw std::runtime_error("MPI provides thread level " + std::to_string(provided) +
                                 ", below MPI_THREAD_SERIALIZED, which sync.overlap needs");
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&g_thread_level);
    }
    comm_ = MPI_COMM_WORLD;
    init_sizes();
  }

  // A communicator split from another: records into the parent's log.
  MpiCommunicator(MPI_Comm comm, CommLog& log) : comm_(comm), owns_comm_(true), log_(&log) { init_sizes(); }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (pair_comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&pair_comm_);
    if (owns_comm_) {
      if (!finalized) MPI_Comm_free(&comm_);
      return;
    }
    log_->flush();
    if (owns_mpi_ && !finalized) {
      free_sixteen_bit_ops();
      MPI_Finalize();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int local_rank() const override { return local_rank_; }
  CommLog& log() override { return *log_; }
  bool concurrent_calls() const override { return g_thread_level == MPI_THREAD_MULTIPLE; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, *log_);
  }

  void allreduce(void* buffer, int64_t count, DType type, ReduceOp op, const char* tag) override {
    const int64_t t0 = start();
    raw_allreduce(buffer, count, type, op);
    const int64_t b = count * dtype_size(type);
    finish(tag, OpKind::kAllreduce, b, b, b, t0);
  }

  void allgather(const void* send, int64_t count, void* recv, DType type, const char* tag) override {
    const int64_t t0 = start();
    const int64_t es = dtype_size(type);
    const int64_t total = count * size_;
    const bool in_place = send == at(recv, rank_ * count * es);
    if (total <= piece_elems(type)) {
      const int c = static_cast<int>(count);
      MPI_Allgather(in_place ? MPI_IN_PLACE : send, c, mpi_type(type), recv, c, mpi_type(type), comm_);
    } else {
      // Too large for int counts: every rank broadcasts its block, in pieces.
      if (!in_place) std::memcpy(at(recv, rank_ * count * es), send, count * es);
      for (int r = 0; r < size_; ++r) raw_broadcast(at(recv, r * count * es), count, type, r);
    }
    finish(tag, OpKind::kAllgather, total * es, count * es, (total - count) * es, t0);
  }

  void allgatherv(const void* send, int64_t send_count, void* recv, const std::vector<int64_t>& recv_counts,
                  DType type, const char* tag) override {
    if (static_cast<int>(recv_counts.size()) != size_ || recv_counts[rank_] != send_count) {
      throw std::invalid_argument("allgatherv " + std::string(tag) + ": recv_counts must have one entry per rank (" +
                                  std::to_string(size_) + ") and this rank's entry must equal send_count");
    }
    const int64_t t0 = start();
    const int64_t es = dtype_size(type);
    std::vector<int64_t> displs(size_, 0);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += recv_counts[r];
    }
    const bool in_place = send == at(recv, displs[rank_] * es);
    if (total <= piece_elems(type)) {
      std::vector<int>& counts = int_scratch_a_;
      std::vector<int>& offsets = int_scratch_b_;
      counts.assign(recv_counts.begin(), recv_counts.end());
      offsets.assign(displs.begin(), displs.end());
      MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, static_cast<int>(send_count), mpi_type(type), recv,
                     counts.data(), offsets.data(), mpi_type(type), comm_);
    } else {
      if (!in_place) std::memcpy(at(recv, displs[rank_] * es), send, send_count * es);
      for (int r = 0; r < size_; ++r) raw_broadcast(at(recv, displs[r] * es), recv_counts[r], type, r);
    }
    finish(tag, OpKind::kAllgatherv, total * es, send_count * es, (total - send_count) * es, t0);
  }

  void alltoall(const void* send, int64_t count, void* recv, DType type, const char* tag) override {
    const int64_t t0 = start();
    const int64_t es = dtype_size(type);
    const int64_t block = count * es;
    if (count * size_ <= piece_elems(type)) {
      const int c = static_cast<int>(count);
      MPI_Alltoall(send, c, mpi_type(type), recv, c, mpi_type(type), comm_);
    } else {
      // Too large for int counts: pairwise exchanges in rotated order (step i: send to rank+i,
      // receive from rank-i), each in pieces.
      std::memcpy(at(recv, rank_ * block), at(send, rank_ * block), block);
      const int64_t piece = piece_elems(type);
      for (int i = 1; i < size_; ++i) {
        const int dst = (rank_ + i) % size_, src = (rank_ - i + size_) % size_;
        for (int64_t off = 0; off < count; off += piece) {
          const int c = static_cast<int>(std::min(piece, count - off));
          MPI_Sendrecv(at(send, dst * block + off * es), c, mpi_type(type), dst, 0, at(recv, src * block + off * es), c,
                       mpi_type(type), src, 0, comm_, MPI_STATUS_IGNORE);
        }
      }
    }
    finish(tag, OpKind::kAlltoall, size_ * block, (size_ - 1) * block, (size_ - 1) * block, t0);
  }

  void broadcast(void* buffer, int64_t count, DType type, int root, const char* tag) override {
    const int64_t t0 = start();
    raw_broadcast(buffer, count, type, root);
    const int64_t b = count * dtype_size(type);
    finish(tag, OpKind::kBroadcast, b, rank_ == root ? b : 0, rank_ == root ? 0 : b, t0);
  }

  void barrier(const char* tag) override {
    const int64_t t0 = start();
    MPI_Barrier(comm_);
    finish(tag, OpKind::kBarrier, 0, 0, 0, t0);
  }

  Request isend(const void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override {
    return post(true, const_cast<void*>(buffer), count, type, peer, channel, tag);
  }

  Request irecv(void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) override {
    return post(false, buffer, count, type, peer, channel, tag);
  }

  void wait(Request& request) override { wait_completion(request); }

  Completion wait_completion(Request& request) override {
    if (request.id < 0) return {};
    const Pending& p = table_.at(static_cast<size_t>(request.id));
    wait_scratch_.assign(1, request);
    wait_all(wait_scratch_);  // the slot stays readable until the next post reuses it
    request.id = -1;
    return {p.peer, (p.send ? p.bytes : p.received) / dtype_size(p.type)};
  }

  void wait_all(std::vector<Request>& requests) override {
    // All pieces of all requests in one array; MPI_Waitsome returns as soon as some complete, so
    // each request is logged at its own completion time.
    mpi_requests_.clear();
    owner_.clear();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].id < 0) continue;
      Pending& p = table_.at(static_cast<size_t>(requests[i].id));
      if (!p.busy) throw std::logic_error("wait on a request that is not pending");
      for (MPI_Request r : p.requests) {
        mpi_requests_.push_back(r);
        owner_.push_back(requests[i].id);
      }
    }
    const int n = static_cast<int>(mpi_requests_.size());
    statuses_.resize(n);
    indices_.resize(n);
    for (int done = 0; done < n;) {
      int completed = 0;
      MPI_Waitsome(n, mpi_requests_.data(), &completed, indices_.data(), statuses_.data());
      if (completed == MPI_UNDEFINED) break;  // nothing active is left
      for (int k = 0; k < completed; ++k) {
        Pending& p = table_[static_cast<size_t>(owner_[indices_[k]])];
        if (!p.send) {
          int got = 0;
          MPI_Get_count(&statuses_[k], mpi_type(p.type), &got);
          p.received += static_cast<int64_t>(got) * dtype_size(p.type);
          if (p.peer == kAnySource) p.peer = statuses_[k].MPI_SOURCE;
        }
        if (--p.open == 0) complete(p, static_cast<size_t>(owner_[indices_[k]]));
      }
      done += completed;
    }
    for (Request& r : requests) r.id = -1;
  }

  [[noreturn]] void abort(int exit_code) override {
    log_->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this keeps the promise if it ever did
  }

 private:
  void init_sizes() {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
    if (size_ == 2 && !user_tunes_allreduce()) MPI_Comm_dup(comm_, &pair_comm_);
  }

  int64_t start() const { return log_->active() ? log_->now_us() : 0; }
  void finish(const char* tag, OpKind kind, int64_t size_bytes, int64_t sent, int64_t received, int64_t t0) {
    log_->record(tag, kind, size_bytes, sent, received, -1, t0, log_->active() ? log_->now_us() : 0, !owns_comm_);
  }

  void raw_allreduce(void* buffer, int64_t count, DType type, ReduceOp op) {
    const int64_t piece = piece_elems(type), es = dtype_size(type);
    const MPI_Op reduce = is_sixteen_bit_float(type) ? sixteen_bit_op(type, op) : mpi_op(op);
    if (pair_comm_ != MPI_COMM_NULL && count * es >= pair_exchange_sizes().min_bytes) {
      pair_allreduce(pair_comm_, rank_, buffer, count, mpi_type(type), es, reduce, pair_scratch_);
      return;
    }
    for (int64_t off = 0; off < count; off += piece) {
      const int c = static_cast<int>(std::min(piece, count - off));
      MPI_Allreduce(MPI_IN_PLACE, at(buffer, off * es), c, mpi_type(type), reduce, comm_);
    }
  }

  void raw_broadcast(void* buffer, int64_t count, DType type, int root) {
    const int64_t piece = piece_elems(type), es = dtype_size(type);
    for (int64_t off = 0; off < count; off += piece) {
      const int c = static_cast<int>(std::min(piece, count - off));
      MPI_Bcast(at(buffer, off * es), c, mpi_type(type), root, comm_);
    }
  }

  Request post(bool send, void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) {
    size_t id = 0;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = table_.size();
      table_.emplace_back();
    }
    Pending& p = table_[id];
    p.tag = tag;
    p.type = type;
    p.bytes = count * dtype_size(type);
    p.received = 0;
    p.peer = peer;
    p.send = send;
    p.busy = true;
    p.t_start_us = start();
    p.requests.clear();
    if (!send && peer == kAnySource && count > piece_elems(type))
      throw std::invalid_argument(std::string("irecv ") + tag + ": an any-source receive must fit one message piece");
    // Pieces of one message share the channel; MPI's non-overtaking rule keeps them in order.
    const int64_t piece = piece_elems(type), es = dtype_size(type);
    int64_t off = 0;
    do {
      const int c = static_cast<int>(std::min(piece, count - off));
      MPI_Request r;
      if (send) {
        MPI_Isend(at(buffer, off * es), c, mpi_type(type), peer, channel, comm_, &r);
      } else {
        MPI_Irecv(at(buffer, off * es), c, mpi_type(type), peer == kAnySource ? MPI_ANY_SOURCE : peer, channel, comm_, &r);
      }
      p.requests.push_back(r);
      off += c;
    } while (off < count);
    p.open = static_cast<int>(p.requests.size());
    return Request{static_cast<int64_t>(id)};
  }

  void complete(Pending& p, size_t id) {
    const int64_t t_end = log_->active() ? log_->now_us() : 0;
    if (p.send) {
      log_->record(p.tag, OpKind::kPointToPoint, p.bytes, p.bytes, 0, p.peer, p.t_start_us, t_end);
    } else {
      log_->record(p.tag, OpKind::kPointToPoint, p.received, 0, p.received, p.peer, p.t_start_us, t_end);
    }
    p.busy = false;
    free_.push_back(id);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  // Two ranks: large allreduces are our own exchange (comm/pair_allreduce.h), on a duplicate of
  // comm_ so its messages never meet the point-to-point traffic of comm_.
  MPI_Comm pair_comm_ = MPI_COMM_NULL;
  PairScratch pair_scratch_;
  bool owns_comm_ = false;  // a split communicator (freed at destruction), not MPI_COMM_WORLD
  int rank_ = 0, size_ = 1, local_size_ = 1, local_rank_ = 0;
  bool owns_mpi_ = false;
  CommLog own_log_;  // MPI_COMM_WORLD's: the process's one log
  CommLog* log_;     // own_log_, or the parent's for a split communicator
  std::vector<Pending> table_;  // Request.id indexes it; finished slots are reused
  std::vector<size_t> free_;
  // Scratch reused across calls, so steady-state calls do not allocate.
  std::vector<MPI_Request> mpi_requests_;
  std::vector<int64_t> owner_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> indices_, int_scratch_a_, int_scratch_b_;
  std::vector<Request> wait_scratch_;
};

}  // namespace

int64_t set_message_piece_bytes(int64_t bytes) {
  const int64_t previous = g_piece_bytes;
  g_piece_bytes = std::clamp<int64_t>(bytes, 1, int64_t(1) << 30);
  return previous;
}

void request_concurrent_calls() { g_want_multiple = true; }

Communicator& world() {
  // Constructed on first use, destroyed (log written, MPI finalized) at exit.
  static MpiCommunicator communicator;
  return communicator;
}

}  // namespace trainer::comm
