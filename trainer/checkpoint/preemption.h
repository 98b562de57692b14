// Preemption: SIGTERM (what clusters send before killing a job) and SIGINT (Ctrl-C) ask the run to
// stop cleanly. The handler only records the signal; the training loop reads it once per step and
// all ranks agree on it in the step's control allreduce (trainer/step/step_clock.h, StepClock::verdict), so every rank
// finishes the same step, the job writes one checkpoint and exits with 128 + the signal (143 for
// SIGTERM, 130 for SIGINT). A second signal ends the process at once (exit 128 + signal, no
// checkpoint), for a user who does not want to wait.
#pragma once

namespace trainer::app {

// Installs the handlers for SIGTERM and SIGINT (idempotent). Also ignores SIGXFSZ, so that a file
// size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk, instead of
// killing the process.
void install_stop_handlers();

// 0, or the first stop signal received (SIGTERM or SIGINT).
int stop_signal_received();

// The exit status of a run stopped by `signal` after its checkpoint: 128 + signal, as a shell
// reports a process killed by it.
inline int stop_exit_status(int signal) { return 128 + signal; }

}  // namespace trainer::app
