#include "comm/comm_wait.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm_log.h"

namespace trainer::comm {

namespace {

constexpr int kRounds = 16;           // ping-pongs per rank; the fastest one is kept
constexpr int kClockChannel = 30001;  // point-to-point channel no training traffic uses

struct Sample {
  double local = 0, offset = 0, precision = 0;
};

// Rank 0 plays ping-pong with every other rank; returns this rank's sample.
Sample measure(Communicator& comm) {
  CommLog& log = comm.log();
  const int p = comm.size(), me = comm.rank();
  // Per rank: its local time at the best round, rank 0's midpoint time of that round, half the RTT.
  std::vector<double> table(3 * static_cast<size_t>(p), 0.0);
  if (me == 0) {
    table[0] = table[1] = static_cast<double>(log.now_us());
    for (int r = 1; r < p; ++r) {
      double best = std::numeric_limits<double>::infinity();
      for (int k = 0; k < kRounds; ++k) {
        int64_t ping = k, their = 0;
        const int64_t t_a = log.now_us();
        Request s = comm.isend(&ping, 1, DType::kI64, r, kClockChannel, "CLOCK_PING");
        Request q = comm.irecv(&their, 1, DType::kI64, r, kClockChannel, "CLOCK_PONG");
        comm.wait(s);
        comm.wait(q);
        const int64_t t_b = log.now_us();
        const double rtt = static_cast<double>(t_b - t_a);
        if (rtt < best) {
          best = rtt;
          table[3 * r] = static_cast<double>(their);
          table[3 * r + 1] = 0.5 * static_cast<double>(t_a + t_b);
          table[3 * r + 2] = 0.5 * rtt;
        }
      }
    }
  } else {
    for (int k = 0; k < kRounds; ++k) {
      int64_t ping = 0;
      Request q = comm.irecv(&ping, 1, DType::kI64, 0, kClockChannel, "CLOCK_PING");
      comm.wait(q);
      int64_t mine = log.now_us();
      Request s = comm.isend(&mine, 1, DType::kI64, 0, kClockChannel, "CLOCK_PONG");
      comm.wait(s);
    }
  }
  comm.broadcast(table.data(), static_cast<int64_t>(table.size()), DType::kF64, 0, "CLOCK_TABLE");
  Sample s;
  s.local = table[3 * me];
  s.offset = table[3 * me + 1] - table[3 * me];
  for (int r = 1; r < p; ++r) s.precision = std::max(s.precision, table[3 * r + 2]);
  return s;
}

}  // namespace

void align_log_clock(Communicator& comm) {
  CommLog& log = comm.log();
  if (!log.enabled()) return;
  CommLog::Pause pause(log);
  const Sample s = measure(comm);
  ClockFit& fit = log.clock();
  if (!fit.valid) {
    fit.valid = true;
    fit.local_a = fit.local_b = s.local;
    fit.offset_a = fit.offset_b = s.offset;
    fit.precision_us = s.precision;
  } else {
    fit.local_b = s.local;
    fit.offset_b = s.offset;
    fit.precision_us = std::max(fit.precision_us, s.precision);
  }
}

void resolve_waits(Communicator& comm) {
  CommLog& log = comm.log();
  CommLog::Pause pause(log);
  // Every rank takes part in the agreement even with its log disabled, so no rank is left waiting.
  const int64_t n = log.enabled() ? static_cast<int64_t>(log.collectives().size()) : -1;
  int64_t lo = n, hi = n;
  comm.allreduce(&lo, 1, DType::kI64, ReduceOp::kMin, "WAIT_COUNT");
  comm.allreduce(&hi, 1, DType::kI64, ReduceOp::kMax, "WAIT_COUNT");
  if (lo < 0) {
    if (log.enabled()) log.set_wait_note("wait not computed: the comm log was disabled on some ranks");
    return;
  }
  if (lo != hi) {
    log.set_wait_note("wait not computed: ranks recorded different numbers of collectives (" + std::to_string(lo) +
                      " to " + std::to_string(hi) + ")");
    return;
  }
  align_log_clock(comm);
  const ClockFit& fit = log.clock();
  const std::vector<CollectiveCall>& calls = log.collectives();
  std::vector<int64_t> last(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) last[i] = fit.to_global(calls[i].t_start_us);
  comm.allreduce(last.data(), n, DType::kI64, ReduceOp::kMax, "WAIT_ENTRIES");
  std::vector<int64_t> wait(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const int64_t duration = calls[i].t_end_us - calls[i].t_start_us;
    wait[i] = std::clamp<int64_t>(last[i] - fit.to_global(calls[i].t_start_us), 0, std::max<int64_t>(duration, 0));
  }
  try {
    log.set_waits(wait);
  } catch (const std::runtime_error& e) {
    // The statistics have the waits; only the records lack them. Not worth failing a finished run.
    std::fprintf(stderr, "warning: %s (records keep no wait_us)\n", e.what());
  }
}

}  // namespace trainer::comm
