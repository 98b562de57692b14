// An experiment, built from a validated Config: the backend (runtime.device), the task (model +
// data), the optimizer and its schedule, and the gradient-sync method, wired to this process's rank.
// The training loop (worker.cpp) starts from here.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "models/backend.h"
#include "optim/schedule.h"
#include "optim/optimizer.h"
#include "trainer/config/config.h"
#include "trainer/config/config_sync.h"
#include "trainer/tasks/task.h"

namespace trainer::app {

struct Experiment {
  models::Backend* backend = nullptr;  // runtime.device: where the model and optimizer state live
  std::unique_ptr<Task> task;
  std::unique_ptr<optim::Optimizer> optimizer;  // optim.name: sgd, adam or adamw
  optim::ScheduleOptions schedule;
  // What moves the sync's device buffers (runtime.communicator; comm/device_communicator.h); null
  // when the sync talks to `world` itself (host buffers). Declared before `sync`, which uses it.
  std::unique_ptr<comm::Communicator> sync_comm;
  bool sync_on_device = false;  // sync_comm's collectives run on the device's stream (NCCL)
  // What the method was built from (config_sync.h: its keys, the recipe with the run's length, the
  // backend); the worker's start notes and default lines read it too.
  comm::SyncOptions sync_options;
  std::unique_ptr<comm::GradientSync> sync;
};

// Applies runtime.threads (0: hardware cores divided by the ranks on this node) and checks
// runtime.precision (precision_plan). Returns the thread count. The backend's own settings are
// given to it when it is made (device_backend).
int configure_runtime(const Config& config, int local_ranks);

// runtime.precision, runtime.deterministic and runtime.conv_algorithm as a backend's settings
// (models/backend_settings.h); runtime.deterministic asks the CPU for direct convolutions.
models::BackendSettings backend_settings(const Config& config);

// runtime.precision in one line for --dry-run and the start line ("bf16 (...)"). Throws
// std::invalid_argument, one line naming the key, where this device cannot run it: tf32 on the CPU,
// bf16 on a CPU below AVX-512, bf16 on CUDA (the GPU half of issue 32 is not built).
std::string precision_plan(const Config& config);

// The backend runtime.device names, with the config's settings (backend_settings), for the rank at
// `local_rank` on its node (a GPU backend takes GPU local_rank % visible GPUs). Throws one line
// naming the key when this build or this machine cannot provide it.
models::Backend& device_backend(const Config& config, int local_rank);

// Everything; `announce` receives progress lines (rank 0). The task's data is shared among the
// ranks of `training` (all of `world`, or async_ps's workers); the sync method talks to `world`.
Experiment build_experiment(const Config& config, comm::Communicator& world, comm::Communicator& training,
                            const std::function<void(const std::string&)>& announce);

// The run's steps: train.epochs of steps_per_epoch, capped by train.max_steps.
int64_t total_steps(const Config& config, int64_t steps_per_epoch);

using trainer::sync_options;  // trainer/config/config_sync.h
// Whether the run has a thread that communicates while the training thread does too (diloco with a
// sync delay, overlapped: comm/sync/methods/outer/outer_transfer.h), so MPI must allow concurrent calls
// (comm::request_concurrent_calls, before comm::world()).
bool needs_concurrent_calls(const Config& config);
optim::ScheduleOptions schedule_options(const OptimConfig& o);
optim::OptimizerOptions optimizer_options(const Config& config);

}  // namespace trainer::app
