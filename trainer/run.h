// The training loop: data -> forward -> backward -> gradient sync -> optimizer -> metrics, with
// periodic evaluation and checkpoints. One function, read top to bottom (docs/architecture.md section 2).
#pragma once

#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "models/parameters.h"
#include "trainer/config.h"

namespace trainer::app {

struct RunOptions {
  std::string resume;  // "" (fresh run), "latest", or a checkpoint folder
  // Testing hooks (hidden CLI flags): stop right after this step as if killed (no final
  // checkpoint), and throw on one rank at one step, to check that the whole job ends.
  int64_t stop_after = -1;
  int fail_rank = -1;
  int64_t fail_step = -1;
};

struct RunSummary {
  int64_t steps = 0;
  double final_accuracy = 0, best_accuracy = 0;
  double seconds = 0, samples_per_s = 0;
  int stop_signal = 0;  // SIGTERM/SIGINT: the run stopped early after writing a checkpoint
};

// An error every rank throws at the same point with the same message (all ranks found it in the
// same collective), so no rank waits in a collective and none needs MPI_Abort: rank 0 prints it and
// every rank exits with `exit_status`.
struct AgreedError : std::runtime_error {
  int exit_status;
  AgreedError(const std::string& what, int status) : std::runtime_error(what), exit_status(status) {}
};
// The exit status of a run ended by a NaN or an infinity in the loss or gradient.
constexpr int kExitNonFinite = 3;

// Trains as the config says on every rank of `comm`. Rank 0 writes config.toml, metrics.jsonl,
// summary.json and comm/summary.txt under the output folder; every rank writes its
// comm/rank<R>.jsonl and checkpoint state. Throws std::runtime_error (one clear line) on bad data
// or a damaged checkpoint, AgreedError on a non-finite loss or gradient (unless skipped) and on a
// failed final checkpoint. On SIGTERM/SIGINT (trainer/preemption.h) it checkpoints and returns
// early with summary.stop_signal set.
RunSummary run_training(const Config& config, const RunOptions& options, comm::Communicator& comm);

// Collective: every rank must start from the same weights (a mismatch would silently train P
// different models); throws std::runtime_error when their checksums differ.
void check_identical(const models::ParameterStore& params, comm::Communicator& comm);

// Prints what a run would do: resolved config, model summary (parameters, gradient bytes), data
// and the sync plan.
void print_dry_run(const Config& config, comm::Communicator& comm);

}  // namespace trainer::app
