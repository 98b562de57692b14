// The network seam: every byte a training step sends goes through a Communicator, and every call
// carries an op tag (docs/architecture.md section 3, e.g. "ALLREDUCE_DENSE", "ISEND_INDEX") that the CommLog
// records with the step, phase, sizes and times. MPI moves host buffers (mpi_communicator.cpp);
// device buffers go through NCCL (comm/cuda/nccl_communicator.h) or MPI with host staging
// (staged_communicator.h), chosen by make_sync_communicator (device_communicator.h). All three log
// a call the same way.
//
// Sizes are in elements of the given DType unless a name says bytes; counts are 64-bit (messages
// beyond MPI's int counts are cut into pieces inside). Collectives are called by all ranks in the
// same order, as in MPI. Each call is one record in the log (comm_log.h): collectives with peer -1,
// `bytes` what leaves this rank and `bytes_recv` what arrives from other ranks (per call below);
// a send or receive is recorded when wait/wait_all completes it, timed from the post.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer::models {
class DeviceStream;
}  // namespace trainer::models

namespace trainer::comm {

class CommLog;

// kBF16 and kF16 are the 16-bit wire formats of comm/wire_format.h (bfloat16, IEEE binary16),
// 2 bytes per element; their sums are rounded to the format at every add (see wire_format.h).
enum class DType { kF32, kF64, kI32, kI64, kU8, kBF16, kF16 };
enum class ReduceOp { kSum, kMax, kMin };
int64_t dtype_size(DType t);

// A pending nonblocking send or receive; complete it with Communicator::wait / wait_all.
struct Request {
  int64_t id = -1;  // index into the communicator's table of pending operations
};

// irecv's peer for "whichever rank sends first on this channel" (MPI_ANY_SOURCE).
constexpr int kAnySource = -1;

// What a completed send or receive moved: the peer (for an any-source receive, the rank that sent)
// and the elements sent or received.
struct Completion {
  int peer = -1;
  int64_t count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks sharing this node (for dividing cores among threads), and this rank's place among them
  // (for choosing a GPU).
  virtual int local_size() const = 0;
  virtual int local_rank() const = 0;

  // The log every call is recorded in (may be disabled; then recording costs two adds and a
  // branch). CommLog::Pause makes calls unlogged (the summary's own gathers).
  virtual CommLog& log() = 0;

  // In place, every op for every type. Logged: count elements sent and count received.
  virtual void allreduce(void* buffer, int64_t count, DType type, ReduceOp op, const char* tag) = 0;
  // send: `count` elements from this rank; recv: size() * count elements, rank order. `send` may be
  // this rank's own block of `recv` (in place). Logged: count sent, (size()-1) * count received.
  virtual void allgather(const void* send, int64_t count, void* recv, DType type, const char* tag) = 0;
  // send: send_count elements; recv_counts[r]: what rank r contributes (all ranks pass the same
  // recv_counts; zeros are fine); recv is laid out in rank order, densely; `send` may be this
  // rank's own block of `recv`. Logged: send_count sent, the other ranks' counts received.
  virtual void allgatherv(const void* send, int64_t send_count, void* recv, const std::vector<int64_t>& recv_counts,
                          DType type, const char* tag) = 0;
  // send/recv: size() blocks of `count` elements each; block r goes to / comes from rank r. The two
  // buffers must not overlap. Logged: (size()-1) * count both ways.
  virtual void alltoall(const void* send, int64_t count, void* recv, DType type, const char* tag) = 0;
  // Logged: the root sends count, every other rank receives count.
  virtual void broadcast(void* buffer, int64_t count, DType type, int root, const char* tag) = 0;
  virtual void barrier(const char* tag) = 0;

  // A communicator over the ranks of this one that pass the same `color` (>= 0), ranked by `key`
  // (ties by their rank here); nullptr on ranks that pass a negative color. Collective over this
  // communicator. The new one records into this one's log (one log per process: every call of every
  // communicator is in comm/rank<R>.jsonl with its op tag; peers are ranks of the communicator the
  // call was made on). Used for worker-only collectives when some ranks are parameter servers.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Point to point. `channel` separates concurrent streams between the same pair (MPI's tag, >= 0);
  // messages on one channel between one pair arrive in the order they were sent. A receive's
  // `count` is its capacity and the log records what actually arrived; a message over 2^30 bytes
  // must be received with exactly the sent count (see set_message_piece_bytes). Buffers must stay
  // untouched until the wait. irecv's peer may be kAnySource: then the message must fit one piece
  // (set_message_piece_bytes), and wait_completion says who sent it.
  virtual Request isend(const void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) = 0;
  virtual Request irecv(void* buffer, int64_t count, DType type, int peer, int channel, const char* tag) = 0;
  // Completes the request and sets its id to -1; waiting on an id of -1 does nothing.
  virtual void wait(Request& request) = 0;
  // wait() that also says who sent (any-source receives) and how many elements moved.
  virtual Completion wait_completion(Request& request) = 0;
  // Completes all, logging each at the moment it completed (not when the last one did).
  virtual void wait_all(std::vector<Request>& requests) = 0;

  // The communicator over the same ranks, with the same log, that moves host memory: this one
  // unless it moves a device's (NCCL, host staging), whose own MPI communicator it then is. For a
  // method that takes device buffers but exchanges lists it built on the host (comm/sync/methods/sparse/sparse_passes.h).
  virtual Communicator& host_side() { return *this; }

  // True when two threads may call at the same time, each on its own communicator of this job (one
  // split from the other): MPI_THREAD_MULTIPLE. Never on one communicator from two threads at once.
  // A method that keeps a transfer running on a thread of its own across training steps (diloco's
  // delayed outer allreduce, comm/sync/methods/outer/outer_transfer.h) asks; false: it communicates inline.
  virtual bool concurrent_calls() const { return false; }

  // Overlap on a device (comm/sync/methods/dense/bucket_reducer.h). on_stream: this communicator with its calls on
  // another stream of its device (`stream`, DeviceMemory::make_stream), sharing its ranks, log and
  // (NCCL) its NCCL communicator: what dense buckets that go out during backward are sent with. Null
  // when it moves host memory (MPI, whose overlap is a host thread). The two must not be called
  // concurrently, and their calls keep one order on every rank.
  virtual std::unique_ptr<Communicator> on_stream(models::DeviceStream& stream) { return nullptr; }
  // True when a collective only enqueues its work on the device's stream and returns (NCCL): the
  // overlap then needs no thread of its own; false when a call waits for its data (MPI, staging).
  virtual bool enqueues() const { return false; }
  // Writes the log records that calls left to their device (an NCCL call made on a stream that the
  // host must not wait for: timed by events, read here, which waits for them). No-op elsewhere.
  virtual void complete_records() {}

  // Ends every rank of the job now (after this rank printed its error): no rank is left waiting
  // in a collective for a peer that will never arrive. Writes out this rank's log first.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// MPI_COMM_WORLD. Initializes MPI on first use and finalizes it at exit; works without mpiexec as a
// world of one. Thread level MPI_THREAD_SERIALIZED (one thread communicates at a time: the training
// thread, or the dense buckets' communication thread while the training thread waits), or
// MPI_THREAD_MULTIPLE after request_concurrent_calls() or with TRAINER_MPI_THREAD=multiple
// (concurrent_calls() then says true). The log is created disabled; the trainer configures it.
Communicator& world();

// Asks world() for MPI_THREAD_MULTIPLE: the run has a thread that communicates while the training
// thread does too (diloco with sync.<method>.sync_delay > 0). Only before world()'s first call: MPI's level
// is fixed at MPI_Init. Not the default because Open MPI then takes a lock around every call.
void request_concurrent_calls();

// Messages are cut into pieces of at most this many bytes (default and maximum 2^30) because MPI
// counts are int. Tests lower it to run the piece paths on small buffers; all ranks must use the
// same value. Returns the previous one.
int64_t set_message_piece_bytes(int64_t bytes);

// Communicators of two ranks allreduce buffers of at least min_bytes as one exchange of messages of
// at most piece_bytes, all posted at once (comm/pair_allreduce.h says why); smaller buffers and larger
// communicators use MPI_Allreduce.
struct PairExchangeSizes {
  int64_t min_bytes = int64_t(1) << 20;      // where a TCP message stops being eager (open_mpi_defaults)
  int64_t piece_bytes = int64_t(512) << 10;  // half the eager limit: room for Open MPI's header
};
// Tests lower both to run the exchange on small buffers; all ranks must use the same values.
// Returns the previous sizes.
PairExchangeSizes set_pair_exchange_sizes(PairExchangeSizes sizes);

}  // namespace trainer::comm
