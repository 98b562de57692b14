// An experiment, built from a validated Config: the datasets, the model, the optimizer and its
// schedule, and the gradient-sync method, wired to this process's rank. The training loop
// (run.cpp) and --dry-run both start from here.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "data/cifar.h"
#include "data/loader.h"
#include "models/model.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "trainer/config.h"

namespace trainer::app {

struct Experiment {
  data::ImageSet train_set, test_set;
  data::Normalization norm{};
  std::unique_ptr<models::ImageClassifier> model;
  std::unique_ptr<optim::Sgd> optimizer;
  optim::ScheduleOptions schedule;
  std::unique_ptr<comm::GradientSync> sync;
};

// Applies runtime.threads (0: hardware cores divided by the ranks on this node) and the
// convolution algorithm. Returns the thread count.
int configure_runtime(const Config& config, int local_ranks);

// The model alone (no data): for --dry-run and the checkpoint identity.
std::unique_ptr<models::ImageClassifier> build_model(const Config& config);

// Everything; generates the synthetic dataset first when data.synthesize_if_missing asks for it
// (rank 0 writes, the others wait at a barrier). `announce` receives progress lines (rank 0).
Experiment build_experiment(const Config& config, comm::Communicator& comm,
                            const std::function<void(const std::string&)>& announce);

comm::SyncOptions sync_options(const Config& config);

}  // namespace trainer::app
