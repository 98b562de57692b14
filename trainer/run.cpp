#include "trainer/run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "comm/comm_summary.h"
#include "comm/sync/methods/async_ps/async_ps.h"
#include "comm/sync/registry.h"
#include "models/model.h"
#include "trainer/config/config_sync.h"
#include "trainer/experiment.h"
#include "trainer/checkpoint/preemption.h"
#include "trainer/checkpoint/reshard.h"
#include "trainer/roles.h"
#include "trainer/run_output.h"

namespace trainer::app {

void print_dry_run(const Config& config, comm::Communicator& comm) {
  if (comm.rank() != 0) return;
  std::printf("%s\n", to_toml(config).c_str());
  std::vector<models::ParamView> views;
  const int64_t n = model_parameter_count(config, &views);
  const size_t tensors = views.size();
  models::Backend& backend = device_backend(config, comm.local_rank());
  std::printf("device: %s\n", backend.describe().c_str());
  std::printf("precision: %s\n", precision_plan(config).c_str());
  std::printf("model: %s, %lld parameters in %zu tensors, gradient %.2f MB per step (%lld bytes)\n",
              config.model.arch.c_str(), static_cast<long long>(n), tensors, n * 4 / 1e6,
              static_cast<long long>(n * 4));
  // A method that applies the update itself has server ranks (the last sync.async_ps.servers), which do not train.
  const bool servers = comm::sync_method(config.sync.method).can.applies_update;
  const int trainers = servers ? std::max<int>(0, comm.size() - static_cast<int>(comm::server_ranks(config.sync))) : comm.size();
  std::printf("data: %s at %s%s, batch %lld per process x %d %s\n", config.data.dataset.c_str(),
              config.data.root.c_str(), config.data.synthesize_if_missing ? " (synthesized if missing)" : "",
              static_cast<long long>(config.data.batch_size), trainers, servers ? "workers" : "processes");
  comm::SyncOptions options = sync_options(config);
  options.backend = &backend;  // a host method on a device run says it goes through host copies
  auto sync = comm::make_gradient_sync(options, comm, n, &views);
  std::printf("sync: %s\n", sync->describe().c_str());
  // The method's own statement of its compressed steps' volume, against dense fp32's ring.
  if (const comm::WireVolume v = sync->wire_volume(); v.words >= 0) {
    const double dense = 2.0 * (comm.size() - 1) / comm.size() * static_cast<double>(n);
    std::printf("wire: %.0f bytes per rank and step, %s", 4 * v.words, v.formula.c_str());
    if (dense > 0 && v.words > 0) std::printf(" (%.1fx fewer than fp32 dense)", dense / v.words);
    std::printf("\n");
  }
  // The defaults this method chose for the recipe (its spec's), where they are in effect.
  for (const std::string& line : method_default_lines(options)) std::printf("default: %s\n", line.c_str());
  for (const std::string& note : config.notes) std::printf("%s\n", note.c_str());
  std::printf("overlap with backward: %s\n", config.sync.overlap ? sync->overlap_plan().c_str()
                                                                  : "off (sync.overlap = false: every message is "
                                                                    "sent after backward)");
  std::printf("output: %s\n", output_dir(config).c_str());
}

RunSummary run_training(const Config& configured, const RunOptions& options, comm::Communicator& comm) {
  const auto run_start = std::chrono::steady_clock::now();
  // A checkpoint of another number of processes keeps its global batch (trainer/checkpoint/reshard.h), which
  // the data loader must know before it is built.
  Config config;
  try {
    config = plan_resume(configured, options.resume, comm);
  } catch (const std::runtime_error& e) {
    throw AgreedError(e.what(), 1);  // every rank decided it from rank 0's look at the checkpoint
  }
  // async_ps: the last sync.async_ps.servers ranks are parameter servers (a bad count is the same error on
  // every rank).
  comm::PsLayout layout;
  if (comm::sync_method(config.sync.method).can.applies_update) {
    try {
      layout = comm::PsLayout::make(comm.size(), comm::server_ranks(config.sync));
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
