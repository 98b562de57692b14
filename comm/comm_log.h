// The communication log: one record per message or collective, per rank, written to
// comm/rank<R>.jsonl exactly as DESIGN.md section 3 specifies, plus running per-op statistics for
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
// Single-threaded, like MPI_THREAD_FUNNELED: only the thread that communicates records.
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
};

struct CommLogOptions {
  bool enabled = false;        // time calls and keep statistics (the summary needs them)
  std::string path;            // comm/rank<R>.jsonl (parent folders are created); empty: no records
  int64_t first_step = 0;      // record steps in [first_step, last_step] ...
  int64_t last_step = -1;      // ... (-1: no end)
  int64_t every = 1;           // ... that are multiples of `every`
  bool append = false;         // keep what the file holds (a resumed run); otherwise truncate
};

// Everything one rank saw of one op tag while the log was enabled (all steps, not only the window).
struct OpStats {
  std::string op;
  OpKind kind = OpKind::kOther;
  int64_t calls = 0;
  int64_t bytes = 0, bytes_recv = 0;  // totals
  int64_t time_us = 0;                // sum of t_end - t_start
  std::vector<int64_t> sizes;         // data size S of every call, in call order
};

struct PhaseStats {
  int64_t calls = 0, bytes = 0, bytes_recv = 0, time_us = 0;
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
  // True when calls should be timed: the log is enabled (and not paused).
  bool active() const { return active_; }
  int64_t now_us() const;

  // One call. `size_bytes` is the call's data size S as nccl-tests counts it (allreduce: the
  // buffer; allgather(v): the whole output; alltoall: the whole send buffer; broadcast: the buffer;
  // point to point: the message). The communicator uses this form.
  void record(const char* op, OpKind kind, int64_t size_bytes, int64_t bytes, int64_t bytes_recv, int peer,
              int64_t t_start_us, int64_t t_end_us) {
    sent_ += bytes;
    received_ += bytes_recv;
    if (active_) record_enabled(op, kind, size_bytes, bytes, bytes_recv, peer, t_start_us, t_end_us);
  }
  // Short form for callers outside the communicator: point to point when peer >= 0, otherwise
  // kOther (bus factor 1); S = max(bytes, bytes_recv).
  void record(const char* op, int64_t bytes, int64_t bytes_recv, int peer, int64_t t_start_us, int64_t t_end_us) {
    record(op, peer >= 0 ? OpKind::kPointToPoint : OpKind::kOther, bytes > bytes_recv ? bytes : bytes_recv, bytes,
           bytes_recv, peer, t_start_us, t_end_us);
  }

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

  bool enabled() const { return options_.enabled; }
  const CommLogOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::vector<OpStats>& op_stats() const { return ops_; }
  const PhaseStats& phase_stats(Phase phase) const { return phases_[static_cast<int>(phase)]; }

 private:
  void record_enabled(const char* op, OpKind kind, int64_t size_bytes, int64_t bytes, int64_t bytes_recv, int peer,
                      int64_t t_start_us, int64_t t_end_us);
  void write_pending();
  void close();

  CommLogOptions options_;
  bool active_ = false;     // enabled and not paused
  bool in_window_ = false;  // the current step's calls become records
  int rank_ = 0, world_ = 1;
  int64_t step_ = 0;
  Phase phase_ = Phase::kDense;
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
};

}  // namespace trainer::comm
