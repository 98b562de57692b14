// A Chrome trace (chrome://tracing, https://ui.perfetto.dev) of a window of training steps: one
// process per rank (pid = rank), with
//   tid 0  "steps"        the step and its compute phases (data, forward_backward, sync, optimizer,
//                         after_step, as the training loop times them)
//   tid 1  "collectives"  every collective of the window
//   tid 2+ "send to R" / "recv from R"  point-to-point messages, one row per peer and direction
//                         (messages overlap, and a trace row shows nesting, not overlap)
// All events are complete events ("ph":"X", ts and dur in microseconds on rank 0's clock, aligned
// as comm_wait.h describes); comm events carry args op, kind, step, phase, bytes, bytes_recv, peer
// and, for collectives once waits are resolved, wait_us and transfer_us. The trace holds exactly the
// calls the log kept for its trace window (CommLogOptions::trace_*).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace trainer::comm {

// One timed compute phase of a step, on this rank's log clock (CommLog::now_us).
struct TraceSpan {
  const char* name = "";  // a string literal
  int64_t step = 0;
  int64_t t_start_us = 0, t_end_us = 0;
};

// Collective. Rank 0 gathers every rank's spans and traced calls and writes one JSON file at `path`
// (atomically, parent folders created); returns the number of comm events written (rank 0; 0 on
// other ranks). Throws std::runtime_error naming the file on failure.
int64_t write_chrome_trace(Communicator& comm, const std::vector<TraceSpan>& spans, const std::string& path);

}  // namespace trainer::comm
