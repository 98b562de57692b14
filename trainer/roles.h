// A rank's role, decided once per run by run_training (run.cpp) after the common start-up (the run
// folder and the comm log): every rank trains, except under sync.method = "async_ps", whose last
// sync.async_ps.servers ranks serve the parameters (comm/sync/methods/async_ps/async_ps_server.h). Both roles take part in
// the world's collectives (checkpoints, the comm log) in the same order.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "trainer/config/config.h"

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

// A training rank: the step loop (worker.cpp). `world`: every rank; `training`: the training ranks
// (all of world, or async_ps's workers), among which the data is shared and evaluation runs.
// `threads`: runtime.threads as applied; `run_start`: for the records' time_s.
RunSummary run_worker(const Config& config, const RunOptions& options, comm::Communicator& world,
                      comm::Communicator& training, int threads, std::chrono::steady_clock::time_point run_start);

// An async_ps server rank (server_role.cpp): builds the model, resumes or checks the initial weights
// with the workers, serves, and writes its checkpoints. Returns true when the run went to its end
// (false: --stop-after).
bool run_server(const Config& config, const RunOptions& options, comm::Communicator& world);

}  // namespace trainer::app
