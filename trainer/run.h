// The training loop: data -> forward -> backward -> (gradient sync) -> optimizer -> metrics,
// with periodic evaluation. One function, read top to bottom (DESIGN.md section 2).
#pragma once

#include "trainer/config.h"

namespace trainer::app {

struct RunSummary {
  int64_t steps = 0;
  double final_accuracy = 0, best_accuracy = 0;
  double seconds = 0, samples_per_s = 0;
};

// Trains as the config says, writing config.toml, metrics.jsonl and summary.json under the
// output folder. Throws std::runtime_error (one clear line) on bad data or a diverged loss.
RunSummary run_training(const Config& config);

// Applies runtime.threads (0: hardware cores divided by the ranks on this node) to OpenMP, oneDNN
// and OpenBLAS. Returns the count.
int configure_threads(int64_t requested);

// Prints what a run would do: resolved config, model summary (parameters, gradient bytes), data.
void print_dry_run(const Config& config);

}  // namespace trainer::app
