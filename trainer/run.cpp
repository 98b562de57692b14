#include "trainer/run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "comm/comm_summary.h"
#include "comm/sync/async_ps.h"
#include "models/model.h"
#include "trainer/experiment.h"
#include "trainer/preemption.h"
#include "trainer/reshard.h"
#include "trainer/roles.h"
#include "trainer/run_output.h"

namespace trainer::app {

namespace {

// What sync.overlap does for this method, for --dry-run.
std::string overlap_plan(const Config& config) {
  const SyncConfig& s = config.sync;
  if (s.method == "async_ps") return "none (async_ps pushes the whole gradient after backward)";
  if (!s.overlap) return "off (sync.overlap = false: every message is sent after backward)";
  if (config.runtime.device != "cpu") return "off (host buffers only; runtime.device = \"" + config.runtime.device + "\")";
  const std::string when = "during backward, each once its gradients are final";
  const std::string dense = "dense buckets are sent " + when;
  if (s.method == "dense") return dense;
  const std::string after_optimizer = s.method == "local_sgd" ? "local_sgd averages parameters after the optimizer step"
                                      : s.method == "diloco"  ? "diloco syncs parameters after the optimizer step"
                                                              : s.method + " selects over the whole gradient";
  std::string then = s.method == "powersgd"
                         ? "powersgd's buckets (their P, Q and uncompressed tensors) are exchanged " + when
                         : "none (" + after_optimizer + ", so it starts after backward)";
  if (s.method == "diloco" && s.sync_delay > 0)
    then = "none during backward; each diloco fragment's allreduce runs on a communication thread during the " +
           std::to_string(s.sync_delay) + " step(s) after its send";
  if (s.dense_warmup_steps > 0)
    return "the first " + std::to_string(s.dense_warmup_steps) + " steps: " + dense + "; then " + then;
  return then;
}

}  // namespace

void print_dry_run(const Config& config, comm::Communicator& comm) {
  if (comm.rank() != 0) return;
  std::printf("%s\n", to_toml(config).c_str());
  std::vector<models::ParamView> views;
  const int64_t n = model_parameter_count(config, &views);
  const size_t tensors = views.size();
  std::printf("device: %s\n", device_backend(config, comm.local_rank()).describe().c_str());
  std::printf("precision: %s\n", precision_plan(config).c_str());
  std::printf("model: %s, %lld parameters in %zu tensors, gradient %.2f MB per step (%lld bytes)\n",
              config.model.arch.c_str(), static_cast<long long>(n), tensors, n * 4 / 1e6,
              static_cast<long long>(n * 4));
  const bool servers = config.sync.method == "async_ps";  // the last sync.servers ranks do not train
  const int trainers = servers ? std::max<int>(0, comm.size() - static_cast<int>(config.sync.servers)) : comm.size();
  std::printf("data: %s at %s%s, batch %lld per process x %d %s\n", config.data.dataset.c_str(),
              config.data.root.c_str(), config.data.synthesize_if_missing ? " (synthesized if missing)" : "",
              static_cast<long long>(config.data.batch_size), trainers, servers ? "workers" : "processes");
  auto sync = comm::make_gradient_sync(sync_options(config), comm, n, &views);
  std::printf("sync: %s\n", sync->describe().c_str());
  std::printf("overlap with backward: %s\n", overlap_plan(config).c_str());
  std::printf("output: %s\n", output_dir(config).c_str());
}

RunSummary run_training(const Config& configured, const RunOptions& options, comm::Communicator& comm) {
  const auto run_start = std::chrono::steady_clock::now();
  // A checkpoint of another number of processes keeps its global batch (trainer/reshard.h), which
  // the data loader must know before it is built.
  Config config;
  try {
    config = plan_resume(configured, options.resume, comm);
  } catch (const std::runtime_error& e) {
    throw AgreedError(e.what(), 1);  // every rank decided it from rank 0's look at the checkpoint
  }
  // async_ps: the last sync.servers ranks are parameter servers (a bad count is the same error on
  // every rank).
  comm::PsLayout layout;
  if (config.sync.method == "async_ps") {
    try {
      layout = comm::PsLayout::make(comm.size(), config.sync.servers);
    } catch (const std::invalid_argument& e) {
      throw AgreedError(e.what(), 1);
    }
  }
  install_stop_handlers();
  const int threads = configure_runtime(config, comm.local_size());
  open_run_output(config, comm, !options.resume.empty());

  // The role, once: async_ps servers serve; every other rank trains. The workers' own collectives
  // (data sharing, evaluation) run on their communicator, the rest on the world.
  if (layout.world == 0) return run_worker(config, options, comm, comm, threads, run_start);
  std::unique_ptr<comm::Communicator> workers = comm.split(layout.is_server(comm.rank()) ? -1 : 0, comm.rank());
  if (workers) return run_worker(config, options, comm, *workers, threads, run_start);
  const bool finished = run_server(config, options, comm);
  finish_comm_log(config, comm, {});
  if (finished) comm::comm_summary(comm);
  return RunSummary{};
}

}  // namespace trainer::app
