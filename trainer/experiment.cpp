#include "trainer/experiment.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <thread>

#include "data/synthetic_cifar.h"
#include "models/cpu/dnnl_ops.h"

namespace trainer::app {
namespace fs = std::filesystem;

int configure_runtime(const Config& config, int local_ranks) {
  int threads = static_cast<int>(config.runtime.threads);
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, local_ranks));
  omp_set_num_threads(threads);  // oneDNN (OpenMP runtime) and OpenBLAS (OpenMP build) follow this
  using models::cpu::ConvAlgorithm;
  const std::string& a = config.runtime.conv_algorithm;
  ConvAlgorithm algorithm = a == "direct" ? ConvAlgorithm::kDirect
                            : a == "winograd" ? ConvAlgorithm::kWinograd
                                              : ConvAlgorithm::kAuto;
  if (config.runtime.deterministic) algorithm = ConvAlgorithm::kDirect;
  models::cpu::set_conv_algorithm(algorithm);
  return threads;
}

std::unique_ptr<models::ImageClassifier> build_model(const Config& c) {
  return models::make_image_model({c.model.arch, c.model.num_classes, static_cast<float>(c.model.label_smoothing),
                                   c.model.freeze_batchnorm},
                                  models::cpu_backend(), static_cast<uint64_t>(c.experiment.seed));
}

comm::SyncOptions sync_options(const Config& c) {
  comm::SyncOptions o;
  o.method = c.sync.method;
  o.dense_warmup_steps = c.sync.dense_warmup_steps;
  o.bucket_mb = c.sync.bucket_mb;
  o.period = c.sync.period;
  o.density = c.sync.density;
  o.local_threshold_every = c.sync.local_threshold_every;
  o.global_threshold_every = c.sync.global_threshold_every;
  o.region_every = c.sync.region_every;
  o.max_in_flight = c.sync.max_in_flight;
  o.balance = c.sync.balance;
  return o;
}

namespace {

bool dataset_present(const std::string& root) {
  for (bool train : {true, false})
    for (const auto& f : data::cifar10_files(root, train))
      if (!fs::exists(f)) return false;
  return true;
}

optim::ScheduleOptions schedule_options(const OptimConfig& o) {
  optim::ScheduleOptions s;
  s.kind = optim::schedule_kind_from_name(o.schedule);
  s.base_lr = o.lr;
  s.milestones = o.milestones;
  s.gamma = o.gamma;
  s.min_lr = o.min_lr;
  s.warmup_steps = o.warmup_steps;
  return s;
}

}  // namespace

Experiment build_experiment(const Config& config, comm::Communicator& comm,
                            const std::function<void(const std::string&)>& announce) {
  const DataConfig& d = config.data;
  if (d.synthesize_if_missing && !dataset_present(d.root)) {
    if (comm.rank() == 0) {
      announce("data: generating the synthetic CIFAR-10-format dataset in " + d.root + " (" +
               std::to_string(d.synthetic_train_size) + " train, " + std::to_string(d.synthetic_test_size) +
               " test images)");
      data::write_synthetic_cifar10(d.root, d.synthetic_train_size, d.synthetic_test_size,
                                    static_cast<uint64_t>(d.synthetic_seed));
    }
    comm.barrier("BARRIER_SETUP");
  }
  Experiment e;
  e.train_set = data::read_cifar10(d.root, true);
  e.test_set = data::read_cifar10(d.root, false);
  e.norm = data::channel_stats(e.train_set);
  e.model = build_model(config);
  const OptimConfig& o = config.optim;
  e.optimizer = std::make_unique<optim::Sgd>(e.model->parameters().size(),
                                             optim::SgdOptions{o.momentum, o.nesterov, o.weight_decay,
                                                               o.decoupled_weight_decay});
  e.schedule = schedule_options(o);
  e.sync = comm::make_gradient_sync(sync_options(config), comm, e.model->parameters().size());
  return e;
}

}  // namespace trainer::app
