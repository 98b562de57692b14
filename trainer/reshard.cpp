#include "trainer/reshard.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "comm/sync/rank_mean.h"

namespace trainer::app {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The saved ranks' flat arrays of one kind, merged: equal everywhere (taken as they are, bit for
// bit), or their mean (comm/sync/rank_mean.h: every new rank computes the same bits). `equal` says
// which it was.
std::vector<float> merge_arrays(const std::vector<SavedRank>& saved, std::vector<float> SavedRank::*array, bool& equal) {
  const std::vector<float>& first = saved.front().*array;
  equal = true;
  for (const SavedRank& r : saved)
    equal = equal && std::memcmp((r.*array).data(), first.data(), first.size() * sizeof(float)) == 0;
  if (equal) return first;
  comm::RankMean mean(static_cast<int64_t>(first.size()));
  for (const SavedRank& r : saved) mean.add((r.*array).data());
  return mean.mean();
}

}  // namespace

int64_t global_batch(const Config& config, int ranks) {
  return config.data.global_batch > 0 ? config.data.global_batch : config.data.batch_size * ranks;
}

int64_t batch_share(const Config& config, int ranks, int rank) {
  const int64_t g = global_batch(config, ranks);
  return (rank + 1) * g / ranks - rank * g / ranks;  // the loaders' contiguous slices (data/loader.h)
}

Config plan_resume(const Config& config, const std::string& which, comm::Communicator& comm) {
  if (which.empty()) return config;
  // Rank 0 looks and every rank takes its answer: {found, world, global batch}.
  int64_t seen[3] = {0, 0, 0};
  if (comm.rank() == 0)
    if (auto ck = peek_checkpoint(output_dir(config), which)) seen[0] = 1, seen[1] = ck->world_size, seen[2] = ck->global_batch;
  comm.broadcast(seen, 3, comm::DType::kI64, 0, "CHECKPOINT_LIST");
  const int64_t saved_world = seen[1], kept_batch = seen[2], world = comm.size();
  if (!seen[0] || (saved_world == world && kept_batch == 0)) return config;  // the exact resume (or load's error)
  if (config.sync.method == "async_ps" && saved_world != world)
    throw std::runtime_error("sync.method 'async_ps' cannot resume on another number of processes yet: the checkpoint "
                             "was written by " + str(saved_world) + ", this run has " + str(world) +
                             " (resume with " + str(saved_world) + ")");
  // The global batch the checkpoint's steps were made of: one an earlier elastic resume kept, or
  // the configured per-process batch times the processes that wrote it.
  const int64_t g = kept_batch > 0 ? kept_batch : config.data.batch_size * saved_world;
  if (g < world)
    throw std::runtime_error("the checkpoint's global batch of " + str(g) + " samples cannot be shared by " + str(world) +
                             " processes (at most " + str(g) + ")");
  if (g % world != 0 && config.train.elastic_batch == "keep_global_even")
    throw std::runtime_error("train.elastic_batch = \"keep_global_even\": " + str(world) +
                             " processes do not divide the checkpoint's global batch of " + str(g) +
                             " samples (keep_global shares it unevenly)");
  Config planned = config;
  planned.data.global_batch = g == config.data.batch_size * world ? 0 : g;
  return planned;
}

std::string apply_resharded(const LoadedCheckpoint& ck, int world, models::ParameterStore& params,
                            models::ParameterStore& buffers, optim::Optimizer& optimizer, comm::GradientSync& sync,
                            int64_t global_batch) {
  const std::vector<SavedRank>& saved = ck.saved;
  const std::string p = str(static_cast<int64_t>(saved.size()));
  const std::string where = "checkpoint " + ck.path + ": ";
  const bool replicated = sync.keeps_parameters_equal();
  for (const SavedRank& r : saved)
    if (r.state.epoch != saved[0].state.epoch || r.state.batch_in_epoch != saved[0].state.batch_in_epoch)
      throw std::runtime_error(where + "its ranks saved different data positions");

  bool params_equal = false, buffers_equal = false;
  const std::vector<float> new_params = merge_arrays(saved, &SavedRank::params, params_equal);
  const std::vector<float> new_buffers = merge_arrays(saved, &SavedRank::buffers, buffers_equal);
  bool optimizer_equal = true;
  for (const SavedRank& r : saved) optimizer_equal = optimizer_equal && r.state.optimizer_state == saved[0].state.optimizer_state;
  if (replicated && !(params_equal && optimizer_equal))
    throw std::runtime_error(where + "its " + p + " ranks saved different " + (params_equal ? "optimizer states" : "parameters") +
                             ", though sync.method '" + sync.name() + "' keeps them equal on every rank");

  // The sync state first: it is the part that may still refuse, and the stores are untouched then.
  std::vector<std::string> states;
  for (const SavedRank& r : saved) states.push_back(r.state.sync_state);
  const std::string sync_note = sync.load_resharded(states);
  std::istringstream opt(saved[0].state.optimizer_state);
  optimizer.load(opt);
  params.copy_values_from_host(new_params.data(), new_params.size() * sizeof(float));
  buffers.copy_values_from_host(new_buffers.data(), new_buffers.size() * sizeof(float));

  const int64_t share = global_batch / world;
  const std::string batch = "global batch " + str(global_batch) + " kept (" +
                            (global_batch % world == 0 ? str(share) + " per process)"
                                                       : str(share) + " or " + str(share + 1) +
                                                             " per process, gradients weighted by share)");
  const std::string weights =
      (params_equal ? "parameters equal on the " + p + " saved ranks, kept"
                    : "parameters: the mean of the " + p + " saved ranks' (they differed: " + sync.name() +
                          " between averaging steps)") +
      (optimizer_equal ? "; optimizer state equal, kept" : "; optimizer state: saved rank 0's (each rank kept its own)");
  const std::string stats = buffers.size() == 0 ? ""
                            : buffers_equal     ? "; BN statistics equal, kept"
                                                : "; BN statistics: the mean of the " + p + " saved ranks'";
  return "re-sharded from " + p + " to " + str(world) + (world == 1 ? " process: " : " processes: ") + batch + "; " + weights + stats + "; " + sync_note;
}

}  // namespace trainer::app
