// A run: data -> forward -> backward -> gradient sync -> optimizer -> metrics, with periodic
// evaluation and checkpoints. run_training does the start-up every rank shares and gives each rank
// its role (trainer/roles.h); the step is made of the parts listed in worker.cpp
// (docs/architecture.md section 2).
#pragma once

#include "comm/communicator.h"
#include "models/parameters.h"
#include "trainer/agreed_error.h"
#include "trainer/config/config.h"
#include "trainer/roles.h"

namespace trainer::app {

// Trains as the config says on every rank of `comm`. Rank 0 writes config.toml, metrics.jsonl,
// summary.json and comm/summary.txt under the output folder; every rank writes its
// comm/rank<R>.jsonl and checkpoint state. Throws std::runtime_error (one clear line) on bad data
// or a damaged checkpoint, AgreedError on a non-finite loss or gradient (unless skipped) and on a
// failed final checkpoint. On SIGTERM/SIGINT (trainer/checkpoint/preemption.h) it checkpoints and returns
// early with summary.stop_signal set.
RunSummary run_training(const Config& config, const RunOptions& options, comm::Communicator& comm);

// Prints what a run would do: resolved config, model summary (parameters, gradient bytes), data
// and the sync plan.
void print_dry_run(const Config& config, comm::Communicator& comm);

}  // namespace trainer::app
