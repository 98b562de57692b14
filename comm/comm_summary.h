// The end-of-run communication summary (docs/architecture.md section 3: comm/summary.txt, printed by rank 0):
// every rank's per-op statistics (comm_log.h) gathered to rank 0 and laid out as a fixed-width
// table, one row per op tag, then totals per phase (dense, compressed) and the grand total. Only
// calls made while a rank's log was enabled count (CommLogOptions::enabled; a path is not needed);
// the table says when some ranks had it disabled. After the phase totals, one line gives each
// rank's total wait in collectives (the straggler view: the rank that waits least is the slow one).
//
// Columns, with calls, bytes and time summed over all ranks (the convention of the published Ok-Top-k
// analyses: 128 dense steps on 8 ranks are 1,024 ALLREDUCE_DENSE calls):
//   calls             number of calls
//   sent MB, recv MB  payload sent and received (10^6 bytes), as the log defines them
//   size min/med/max  data size S of one call (the median is the lower middle value); S is what
//                     nccl-tests calls the size: allreduce and broadcast the buffer, allgather(v)
//                     the whole output, alltoall the whole send buffer, a send or receive the message
//   time ms, mean ms  total latency (t_end - t_start) and its mean per call
//   wait ms           of that time, how long ranks waited in a collective for the last rank to enter
//                     it (comm_wait.h; "-" for point to point and before resolve_waits ran)
//   transfer ms       time ms - wait ms
//   time %            share of all communication time
//   algbw GB/s        sum of S / sum of time (10^9 bytes/s): the mean call's S / t
//   busbw GB/s        algbw times the bus factor of the op's kind, so that numbers are comparable
//                     across world sizes and to link peak bandwidths: allreduce 2(P-1)/P;
//                     allgather, allgatherv, alltoall (P-1)/P; broadcast, point to point and
//                     other 1 (barriers have no bandwidth).
// algbw and busbw follow NVIDIA nccl-tests, doc/PERFORMANCE.md
// (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
#pragma once

#include <string>

#include "comm/comm_log.h"
#include "comm/communicator.h"

namespace trainer::comm {

// Collective: every rank calls it. Its own traffic is not logged (CommLog::Pause). Rank 0 returns the
// table; other ranks return "". When `machine` is given, rank 0 also stores there the same merged
// statistics as JSON (comm/summary.json, read by `trainer report` to check its totals and to know
// each op's kind): {"world_size", "enabled_ranks", "ops": [{"op", "kind", "calls", "bytes",
// "bytes_recv", "time_us", "sizes": [[S, count], ...]}], "phases": {"dense"|"compressed": {"calls",
// "bytes", "bytes_recv", "time_us"}}}, every count summed over ranks.
std::string comm_summary(Communicator& comm, std::string* machine = nullptr);

// Writes the table atomically (a temporary file beside `path`, then rename), creating parent
// folders. Throws std::runtime_error naming the file on failure.
void write_comm_summary(const std::string& text, const std::string& path);

// The bus factor above, for a kind of call on P ranks.
double busbw_factor(OpKind kind, int world_size);

}  // namespace trainer::comm
