// The communication log: one record per message or collective, per rank, written to
// comm/rank<R>.jsonl exactly as docs/architecture.md section 3 specifies, plus running per-op statistics for
// the end-of-run summary (comm_summary.h) and the byte totals that metrics.jsonl reports per step.
//
// Three levels of work, so that a disabled log costs nothing measurable:
//   always          bytes sent/received are added to two counters (take_totals)
//   enabled         the caller times the call (active()), per-op and per-phase statistics are kept
//                   for every call, and ...
//   enabled, with a path, in the step window [first_step, last_step] with step % every == 0
//                   ... the call is also appended as a record; records go to the file in batches
//                   (plain fwrite of a few thousand lines), never one write per call.
//
// Wait versus transfer (comm_wait.h): while enabled, every collective's entry and exit time is kept
// in memory (24 bytes a call), so that at the end of the run the ranks' entry times can be compared
// call by call. A collective's `wait_us` is how long this rank sat in it before the last rank
// arrived; the rest of its duration is transfer. The comparison happens once, after training
// (resolve_waits), and then adds wait_us/transfer_us to this run's collective records in the file.
// Calls in the trace window (CommLogOptions::trace_*) are also kept in memory for the Chrome trace.
//
// Single-threaded, like MPI_THREAD_SERIALIZED: only the thread communicating at the moment records
// (the training thread, or during an overlapped backward the BucketReducer's thread). A thread that
// communicates while the training thread does too (diloco's outer transfer, comm/sync/methods/outer/outer_transfer.h)
// defers its records instead (CommLog::Deferral) and the training thread replays them later.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace trainer::comm {

enum class Phase { kDense, kCompressed };
const char* phase_name(Phase phase);  // "dense", "compressed"

// What kind of transfer a call is: decides the data size S and the bus-bandwidth factor the summary
// uses (nccl-tests' definitions, see comm_summary.h).
enum class OpKind { kAllreduce, kAllgather, kAllgatherv, kAlltoall, kBroadcast, kBarrier, kPointToPoint, kOther };
const char* op_kind_name(OpKind kind);  // "allreduce", ..., "p2p", "other"

struct CommRecord {
  int64_t step = 0;
  Phase phase = Phase::kDense;
  const char* op = "";    // the op tag; a string literal (kept by pointer until the batch is written)
  int64_t bytes = 0;      // payload this rank sends
  int64_t bytes_recv = 0; // payload this rank receives
  int peer = -1;          // -1 for collectives
  int64_t t_start_us = 0, t_end_us = 0;  // microseconds since the log was opened
  int64_t ready_us = -1;  // an overlapped bucket: when backward had written its last gradient (-1: none)
  bool compute = false;   // not a message: a compute phase of the step (record_compute)
};

struct CommLogOptions {
  bool enabled = false;        // time calls and keep statistics (the summary needs them)
  std::string path;            // comm/rank<R>.jsonl (parent folders are created); empty: no records
  int64_t first_step = 0;      // record steps in [first_step, last_step] ...
  int64_t last_step = -1;      // ... (-1: no end)
  int64_t every = 1;           // ... that are multiples of `every`
  bool append = false;         // keep what the file holds (a resumed run); otherwise truncate
  int64_t trace_first_step = 0;  // keep the calls of steps [trace_first_step, trace_last_step] ...
  int64_t trace_last_step = -1;  // ... in memory for the Chrome trace (-1: none)
};

// A call as record() received it on a thread that defers its records (CommLog::Deferral).
struct DeferredCall {
  const char* op = "";
  OpKind kind = OpKind::kOther;
  int64_t size_bytes = 0, bytes = 0, bytes_recv = 0;
  int peer = -1;
  int64_t t_start_us = 0, t_end_us = 0;
  bool every_rank = true;
};

// One collective call as the wait analysis needs it (times on this rank's log clock).
struct CollectiveCall {
  int64_t t_start_us = 0, t_end_us = 0;
  int32_t op = 0;  // index into op_stats()
  Phase phase = Phase::kDense;
};

// A call kept for the Chrome trace: the record plus what the trace shows beyond it.
struct TracedCall {
  CommRecord record;
  OpKind kind = OpKind::kOther;
  int64_t collective = -1;  // index into collectives() (-1: point to point)
};

// This rank's log clock against rank 0's, measured by ping-pong (comm_wait.h): rank 0's time is
// local + offset_us(local). Two samples (start and end of the run) give a linear fit, which also
// absorbs drift between machines' clocks; precision_us bounds the error (half the best round trip).
struct ClockFit {
  bool valid = false;
  double local_a = 0, offset_a = 0;  // first sample: local time, offset
  double local_b = 0, offset_b = 0;  // second sample (equal to the first until it is taken)
  double precision_us = 0;
  double offset_us(double local) const {
    if (!valid) return 0;
    if (local_b <= local_a) return offset_a;
    return offset_a + (offset_b - offset_a) * (local - local_a) / (local_b - local_a);
  }
  int64_t to_global(int64_t local) const { return local + static_cast<int64_t>(offset_us(static_cast<double>(local))); }
};

// Everything one rank saw of one op tag while the log was enabled (all steps, not only the window).
struct OpStats {
  std::string op;
  OpKind kind = OpKind::kOther;
  int64_t calls = 0;
  int64_t bytes = 0, bytes_recv = 0;  // totals
  int64_t time_us = 0;                // sum of t_end - t_start
  int64_t wait_us = 0;                // part of time_us spent waiting for the last rank (collectives,
                                      // once resolve_waits ran; 0 for point to point)
  std::vector<int64_t> sizes;         // data size S of every call, in call order
};

struct PhaseStats {
  int64_t calls = 0, bytes = 0, bytes_recv = 0, time_us = 0, wait_us = 0;
};

class CommLog {
 public:
  CommLog() = default;
  ~CommLog();
  CommLog(const CommLog&) = delete;
  CommLog& operator=(const CommLog&) = delete;

  // (Re)starts the log: writes out and closes a previous file, clears statistics and totals, and
  // restarts the clock. Throws std::runtime_error naming the file when it cannot be opened.
  void open(const CommLogOptions& options, int rank, int world_size);
  // The step and phase the following records belong to (GradientSync sets them every step).
  void set_step(int64_t step, Phase phase);
  // True when calls should be timed: the log is enabled (and not paused); on a deferring thread,
  // what it was when the Deferral was made.
  bool active() const { return deferred_ ? deferred_active_ : active_; }
  int64_t now_us() const;

  // One call. `size_bytes` is the call's data size S as nccl-tests counts it (allreduce: the
  // buffer; allgather(v): the whole output; alltoall: the whole send buffer; broadcast: the buffer;
  // point to point: the message). The communicator uses this form.
  // `every_rank`: a collective that every rank of the job takes part in (false for the collectives of
  // a sub-communicator, which the wait split leaves out: it matches collectives across all ranks).
  void record(const char* op, OpKind kind, int64_t size_bytes, int64_t bytes, int64_t bytes_recv, int peer,
              int64_t t_start_us, int64_t t_end_us, bool every_rank = true) {
    if (deferred_) {
      deferred_->push_back(
          DeferredCall{op, kind, size_bytes, bytes, bytes_recv, peer, t_start_us, t_end_us, every_rank});
      return;
    }
    sent_ += bytes;
    received_ += bytes_recv;
    if (active_) record_enabled(op, kind, size_bytes, bytes, bytes_recv, peer, t_start_us, t_end_us, every_rank);
  }
  // Short form for callers outside the communicator: point to point when peer >= 0, otherwise
  // kOther (bus factor 1); S = max(bytes, bytes_recv).
  void record(const char* op, int64_t bytes, int64_t bytes_recv, int peer, int64_t t_start_us, int64_t t_end_us) {
    record(op, peer >= 0 ? OpKind::kPointToPoint : OpKind::kOther, bytes > bytes_recv ? bytes : bytes_recv, bytes,
           bytes_recv, peer, t_start_us, t_end_us);
  }

  // The next record's ready time (BucketReducer: when its bucket's gradients were final); any thread
  // that communicates may set it just before its call.
  void set_ready(int64_t t_us) { ready_us_ = t_us; }
  // Takes the ready time set for the next record (a call whose record is written later: the NCCL
  // communicator's on a second stream, which sets it again then).
  int64_t take_ready() {
    const int64_t t = ready_us_;
    ready_us_ = -1;
    return t;
  }
  // A compute phase of the current step (op "BACKWARD": its forward and backward pass), written as a
  // record with "kind":"compute" so that readers can tell how much communication ran during it. Not
  // a message: no statistics, totals, waits or trace.
  void record_compute(const char* name, int64_t t_start_us, int64_t t_end_us);

  // Bytes this rank sent and received since the last call (per-step metrics).
  void take_totals(int64_t& sent, int64_t& received);
  // Writes pending records to the file and flushes it.
  void flush();

  // While a Pause lives nothing is recorded and the totals do not move: the summary's own gathers
  // (and any other bookkeeping traffic) are not part of the run being measured.
  class Pause {
   public:
    explicit Pause(CommLog& log) : log_(log), active_(log.active_), sent_(log.sent_), received_(log.received_) {
      log.active_ = false;
    }
    ~Pause() {
      log_.active_ = active_;
      log_.sent_ = sent_;
      log_.received_ = received_;
    }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    CommLog& log_;
    bool active_;
    int64_t sent_, received_;
  };

  // A thread that makes calls while another thread records (or calls) too must leave the log alone:
  // while a Deferral lives on a thread, every record() made on that thread (into any log) is appended
  // to `into` and changes nothing else, and active() there answers `active` (the log's state, read by
  // the thread that made the Deferral's owner start the work: the deferring thread reads nothing of
  // the log's but its clock, which only open() changes). The owner hands the list to replay() on the
  // recording thread once the work is done, at a point every rank reaches in the same order, so that
  // the collectives keep one order on every rank (the wait analysis matches them by position).
  class Deferral {
   public:
    Deferral(std::vector<DeferredCall>& into, bool active) {
      deferred_ = &into;
      deferred_active_ = active;
    }
    ~Deferral() { deferred_ = nullptr; }
    Deferral(const Deferral&) = delete;
    Deferral& operator=(const Deferral&) = delete;
  };
  // Records deferred calls as made during `step` in `phase` (with their own times, and their bytes in
  // the totals from now on); the current step and phase stay what they were.
  void replay(const std::vector<DeferredCall>& calls, int64_t step, Phase phase);

  // Collectives recorded while enabled, in call order (the same order on every rank).
  const std::vector<CollectiveCall>& collectives() const { return collectives_; }
  // Sets the wait of every collective (same length as collectives()): adds them to the per-op and
  // per-phase statistics and, when records were written, rewrites this run's part of the file with
  // wait_us and transfer_us on every collective record. Throws std::runtime_error naming the file.
  void set_waits(const std::vector<int64_t>& wait_us);
  // The waits set_waits was given (empty before).
  const std::vector<int64_t>& waits() const { return waits_; }
  // Why waits are not available ("" when they are or resolve_waits has not run yet).
  const std::string& wait_note() const { return wait_note_; }
  void set_wait_note(const std::string& note) { wait_note_ = note; }
  ClockFit& clock() { return clock_; }
  const ClockFit& clock() const { return clock_; }
  const std::vector<TracedCall>& traced() const { return traced_; }

  bool enabled() const { return options_.enabled; }
  const CommLogOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::vector<OpStats>& op_stats() const { return ops_; }
  const PhaseStats& phase_stats(Phase phase) const { return phases_[static_cast<int>(phase)]; }

 private:
  void record_enabled(const char* op, OpKind kind, int64_t size_bytes, int64_t bytes, int64_t bytes_recv, int peer,
                      int64_t t_start_us, int64_t t_end_us, bool every_rank);
  void write_pending();
  void close();

  static inline thread_local std::vector<DeferredCall>* deferred_ = nullptr;  // this thread's Deferral
  static inline thread_local bool deferred_active_ = false;

  CommLogOptions options_;
  bool active_ = false;     // enabled and not paused
  bool in_window_ = false;  // the current step's calls become records
  int rank_ = 0, world_ = 1;
  int64_t step_ = 0;
  Phase phase_ = Phase::kDense;
  int64_t ready_us_ = -1;
  int64_t sent_ = 0, received_ = 0;
  std::vector<CommRecord> pending_;
  std::vector<OpStats> ops_;
  size_t last_op_ = 0;  // the op looked up last (consecutive calls usually repeat it) ...
  const char* last_tag_ = nullptr;  // ... and the literal it was looked up by
  PhaseStats phases_[2];
  std::FILE* file_ = nullptr;
  long committed_ = 0;  // bytes of the file known to be whole records (at the last good flush)
  void stop_logging(int err);
  std::string line_buffer_;
  int64_t t0_ns_ = 0;
  std::vector<CollectiveCall> collectives_;
  std::vector<int64_t> waits_;
  std::string wait_note_;
  ClockFit clock_;
  bool in_trace_ = false;  // the current step's calls are kept for the trace
  std::vector<TracedCall> traced_;
  // The file as this run found it (bytes kept from a previous run), the records this run wrote,
  // and which of them are collectives (record number, index into collectives_), for set_waits.
  int64_t file_start_bytes_ = 0;
  int64_t records_written_ = 0;
  std::vector<std::pair<int64_t, int64_t>> written_collectives_;
  std::vector<int64_t> pending_collective_;  // per pending record: its collective index or -1
};

}  // namespace trainer::comm
