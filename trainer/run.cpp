#include "trainer/run.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "data/cifar.h"
#include "data/loader.h"
#include "data/synthetic_cifar.h"
#include "models/model.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "trainer/metrics.h"

namespace trainer::app {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Makes sure data.root holds a CIFAR-10-format dataset, generating the synthetic one if asked to.
void prepare_dataset(const DataConfig& d, Progress& progress) {
  bool present = true;
  for (const auto& f : data::cifar10_files(d.root, true)) present = present && fs::exists(f);
  for (const auto& f : data::cifar10_files(d.root, false)) present = present && fs::exists(f);
  if (present || !d.synthesize_if_missing) return;
  progress.line("data: generating the synthetic CIFAR-10-format dataset in " + d.root + " (" +
                std::to_string(d.synthetic_train_size) + " train, " + std::to_string(d.synthetic_test_size) +
                " test images)");
  data::write_synthetic_cifar10(d.root, d.synthetic_train_size, d.synthetic_test_size,
                                static_cast<uint64_t>(d.synthetic_seed));
}

models::ModelOptions model_options(const Config& c) {
  return {c.model.arch, c.model.num_classes, static_cast<float>(c.model.label_smoothing)};
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

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

EvalResult evaluate(models::ImageClassifier& model, const data::ImageSet& set, const data::Normalization& norm,
                    const DataConfig& d) {
  data::LoaderOptions opts;
  opts.batch_size = d.eval_batch_size;
  opts.shuffle = false;
  opts.augment = false;
  opts.drop_last = false;
  opts.threads = static_cast<int>(d.loader_threads);
  data::ImageLoader loader(set, norm, opts);
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    int64_t hits = 0;
    const double loss = model.forward(models::Tensor{batch.images.data(), {batch.size, 3, 32, 32}},
                                      batch.labels.data(), models::Mode::kEval, &hits);
    loss_sum += loss * batch.size;
    correct += hits;
    r.samples += batch.size;
  }
  r.loss = r.samples ? loss_sum / r.samples : 0;
  r.accuracy = r.samples ? static_cast<double>(correct) / r.samples : 0;
  return r;
}

}  // namespace

int configure_threads(int64_t requested) {
  int threads = static_cast<int>(requested);
  if (threads <= 0) {
    // Open MPI tells each rank how many ranks share its node; divide the cores among them.
    int local_ranks = 1;
    if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_ranks = std::max(1, std::atoi(s));
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_ranks);
  }
  omp_set_num_threads(threads);  // oneDNN (OpenMP runtime) and OpenBLAS (OpenMP build) follow this
  return threads;
}

void print_dry_run(const Config& config) {
  std::printf("%s\n", to_toml(config).c_str());
  auto model = models::make_image_model(model_options(config), models::cpu_backend(),
                                        static_cast<uint64_t>(config.experiment.seed));
  const int64_t n = model->parameters().size();
  std::printf("model: %s, %lld parameters in %zu tensors, gradient %.2f MB per step (%lld bytes)\n",
              config.model.arch.c_str(), static_cast<long long>(n), model->parameters().views().size(),
              n * 4 / 1e6, static_cast<long long>(n * 4));
  std::printf("data: %s at %s%s, batch %lld per process\n", config.data.dataset.c_str(), config.data.root.c_str(),
              config.data.synthesize_if_missing ? " (synthesized if missing)" : "",
              static_cast<long long>(config.data.batch_size));
  std::printf("sync: single process (no gradient exchange)\n");
  std::printf("output: %s\n", output_dir(config).c_str());
}

RunSummary run_training(const Config& config) {
  const auto t_start = Clock::now();
  Progress progress(Progress::stdout_is_terminal());
  const int threads = configure_threads(config.runtime.threads);
  const std::string out = output_dir(config);
  fs::create_directories(out);
  {
    std::ofstream f(out + "/config.toml");
    f << to_toml(config);
    if (!f) throw std::runtime_error(out + "/config.toml: write failed");
  }
  MetricsWriter metrics(out + "/metrics.jsonl");

  const DataConfig& d = config.data;
  prepare_dataset(d, progress);
  const data::ImageSet train_set = data::read_cifar10(d.root, true);
  const data::ImageSet test_set = data::read_cifar10(d.root, false);
  const data::Normalization norm = data::channel_stats(train_set);

  const uint64_t seed = static_cast<uint64_t>(config.experiment.seed);
  auto model = models::make_image_model(model_options(config), models::cpu_backend(), seed);
  models::ParameterStore& params = model->parameters();
  optim::Sgd sgd(params.size(), {config.optim.momentum, config.optim.nesterov, config.optim.weight_decay,
                                 config.optim.decoupled_weight_decay});
  const optim::ScheduleOptions schedule = schedule_options(config.optim);

  data::LoaderOptions lo;
  lo.batch_size = d.batch_size;
  lo.shuffle = true;
  lo.augment = d.augment;
  lo.drop_last = true;
  lo.seed = seed;
  lo.threads = static_cast<int>(d.loader_threads);
  data::ImageLoader loader(train_set, norm, lo);
  const int64_t steps_per_epoch = loader.batches_per_epoch();
  if (steps_per_epoch == 0)
    throw std::runtime_error(d.root + ": " + std::to_string(train_set.size()) +
                             " training images are fewer than one batch of " + std::to_string(d.batch_size));
  int64_t total_steps = config.train.epochs * steps_per_epoch;
  if (config.train.max_steps > 0) total_steps = std::min(total_steps, config.train.max_steps);

  progress.line("trainer: " + config.experiment.name + ": " + config.model.arch + " (" +
                std::to_string(params.size()) + " parameters) on " + std::to_string(train_set.size()) +
                " images, " + std::to_string(total_steps) + " steps of batch " + std::to_string(d.batch_size) +
                ", " + std::to_string(threads) + " threads; output in " + out);

  RunSummary summary;
  // Interval accumulators, reset at each log line.
  double loss_sum = 0, t_data = 0, t_compute = 0, t_optim = 0;
  int64_t interval_steps = 0, interval_samples = 0, interval_correct = 0;
  auto interval_start = Clock::now();
  const auto train_start = Clock::now();

  auto run_eval = [&](int64_t step, int64_t epoch) {
    const auto t0 = Clock::now();
    EvalResult r = evaluate(*model, test_set, norm, d);
    summary.final_accuracy = r.accuracy;
    summary.best_accuracy = std::max(summary.best_accuracy, r.accuracy);
    metrics.write({{"split", "test"}, {"step", step}, {"epoch", epoch}, {"time_s", ms_since(t_start) / 1e3},
                   {"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples}});
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval  step %lld epoch %lld: test loss %.4f, accuracy %.2f%% (%lld images, %.1fs)",
                  static_cast<long long>(step), static_cast<long long>(epoch), r.loss, 100 * r.accuracy,
                  static_cast<long long>(r.samples), ms_since(t0) / 1e3);
    progress.line(buf);
  };

  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t epoch = step / steps_per_epoch;
    auto t0 = Clock::now();
    data::Batch batch = loader.next();
    t_data += ms_since(t0);

    t0 = Clock::now();
    int64_t correct = 0;
    const double loss = model->forward(models::Tensor{batch.images.data(), {batch.size, 3, 32, 32}},
                                       batch.labels.data(), models::Mode::kTrain, &correct);
    if (!std::isfinite(loss))
      throw std::runtime_error("training diverged: loss is " + std::to_string(loss) + " at step " +
                               std::to_string(step) + " (lower optim.lr or set optim.grad_clip_norm)");
    model->backward();
    t_compute += ms_since(t0);

    t0 = Clock::now();
    if (config.optim.grad_clip_norm > 0) optim::clip_grad_norm(params.grads(), params.size(), config.optim.grad_clip_norm);
    const double lr = optim::learning_rate(schedule, step, steps_per_epoch, total_steps);
    sgd.step(params.values(), params.grads(), lr);
    t_optim += ms_since(t0);

    loss_sum += loss;
    interval_steps += 1;
    interval_samples += batch.size;
    interval_correct += correct;
    const int64_t done = step + 1;
    const bool log_now = done % config.train.log_every_steps == 0 || done == total_steps;
    const double interval_s = ms_since(interval_start) / 1e3;
    const double rate = interval_samples / std::max(interval_s, 1e-9);
    const double elapsed = ms_since(train_start) / 1e3;
    char line[200];
    std::snprintf(line, sizeof line, "step %lld/%lld  epoch %lld  loss %.4f  lr %.4g  %.0f samples/s  ETA %s",
                  static_cast<long long>(done), static_cast<long long>(total_steps), static_cast<long long>(epoch),
                  loss_sum / interval_steps, lr, rate,
                  format_duration(elapsed / done * (total_steps - done)).c_str());
    progress.step(line, log_now);
    if (log_now) {
      const double k = 1.0 / interval_steps;
      metrics.write({{"step", done}, {"epoch", epoch}, {"time_s", ms_since(t_start) / 1e3},
                     {"loss", loss_sum * k}, {"train_accuracy", static_cast<double>(interval_correct) / interval_samples},
                     {"lr", lr}, {"samples_per_s", rate}, {"t_data_ms", t_data * k}, {"t_compute_ms", t_compute * k},
                     {"t_sync_ms", 0.0}, {"t_optim_ms", t_optim * k}, {"bytes_sent", 0}, {"density", 1.0},
                     {"phase", "dense"}});
      loss_sum = t_data = t_compute = t_optim = 0;
      interval_steps = interval_samples = interval_correct = 0;
      interval_start = Clock::now();
    }
    const bool epoch_end = done % steps_per_epoch == 0;
    const int64_t every = config.train.eval_every_steps;
    if ((every > 0 && done % every == 0) || (every == 0 && epoch_end) || done == total_steps) run_eval(done, epoch);
  }
  progress.finish();

  summary.steps = total_steps;
  summary.seconds = ms_since(t_start) / 1e3;
  summary.samples_per_s = total_steps * d.batch_size / std::max(ms_since(train_start) / 1e3, 1e-9);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "done: %lld steps in %s (%.0f samples/s); test accuracy final %.2f%%, best %.2f%%",
                static_cast<long long>(summary.steps), format_duration(summary.seconds).c_str(),
                summary.samples_per_s, 100 * summary.final_accuracy, 100 * summary.best_accuracy);
  progress.line(buf);
  std::ofstream(out + "/summary.json") << nlohmann::json{{"steps", summary.steps},
                                                        {"final_accuracy", summary.final_accuracy},
                                                        {"best_accuracy", summary.best_accuracy},
                                                        {"seconds", summary.seconds},
                                                        {"samples_per_s", summary.samples_per_s}}
                                              .dump(2)
                                       << "\n";
  return summary;
}

}  // namespace trainer::app
