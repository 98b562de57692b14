// Wait (skew) apart from transfer: how much of a collective's time a rank spent waiting for the
// last rank to arrive, as DeepSpeed's straggler view reports it.
//
// Each rank's log has its own clock (microseconds since it opened). align_log_clock measures that
// clock against rank 0's by ping-pong (rank 0 with each rank in turn, the round trip with the
// smallest time wins; the offset's error is at most half that round trip, a few microseconds
// between processes of one machine). It runs at the start of a run and again inside resolve_waits
// at the end; the two samples give a linear fit (ClockFit), so clock drift between machines does not
// grow into the waits of a long run.
//
// resolve_waits, at the end of the run: every rank puts its collectives' entry times on rank 0's
// clock, one allreduce(max) gives the last rank's entry per call (collectives are matched by call
// order, which MPI already requires to be the same on every rank), and each call's
//   wait_us = clamp(last entry - own entry, 0, duration),   transfer_us = duration - wait_us.
// Nothing happens during training: the only traffic is the ping-pongs and one allreduce of 8 bytes
// per collective call, both unlogged (CommLog::Pause). Point-to-point messages have no "last rank"
// and get no wait.
#pragma once

#include "comm/communicator.h"

namespace trainer::comm {

// Collective. Takes one clock sample (the first, or the second when one exists) into
// comm.log().clock(). Does nothing when the log is disabled.
void align_log_clock(Communicator& comm);

// Collective. Takes the second clock sample, computes every collective's wait and hands them to
// CommLog::set_waits (statistics, and wait_us/transfer_us in this run's records). When the ranks
// recorded different numbers of collectives, sets a wait note instead. Does nothing when the log is
// disabled on all ranks.
void resolve_waits(Communicator& comm);

}  // namespace trainer::comm
