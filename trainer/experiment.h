// An experiment, built from a validated Config: the task (model + data), the optimizer and its
// schedule, and the gradient-sync method, wired to this process's rank. The training loop
// (run.cpp) starts from here.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "optim/schedule.h"
#include "optim/optimizer.h"
#include "trainer/config.h"
#include "trainer/task.h"

namespace trainer::app {

struct Experiment {
  std::unique_ptr<Task> task;
  std::unique_ptr<optim::Optimizer> optimizer;  // optim.name: sgd, adam or adamw
  optim::ScheduleOptions schedule;
  std::unique_ptr<comm::GradientSync> sync;
};

// Applies runtime.threads (0: hardware cores divided by the ranks on this node) and the
// convolution algorithm. Returns the thread count.
int configure_runtime(const Config& config, int local_ranks);

// Everything; `announce` receives progress lines (rank 0). The task's data is shared among the
// ranks of `training` (all of `world`, or async_ps's workers); the sync method talks to `world`.
Experiment build_experiment(const Config& config, comm::Communicator& world, comm::Communicator& training,
                            const std::function<void(const std::string&)>& announce);

// The run's steps: train.epochs of steps_per_epoch, capped by train.max_steps.
int64_t total_steps(const Config& config, int64_t steps_per_epoch);

comm::SyncOptions sync_options(const Config& config);
optim::ScheduleOptions schedule_options(const OptimConfig& o);
optim::OptimizerOptions optimizer_options(const Config& config);

}  // namespace trainer::app
