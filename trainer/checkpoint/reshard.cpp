#include "trainer/checkpoint/reshard.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "comm/sync/methods/async_ps/async_ps_state.h"
#include "comm/sync/codecs/rank_mean.h"
#include "comm/sync/registry.h"

namespace trainer::app {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The saved ranks' flat arrays of one kind, merged: equal everywhere (taken as they are, bit for
// bit), or their mean (comm/sync/codecs/rank_mean.h: every new rank computes the same bits). `equal` says
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

std::string batch_note(int64_t global_batch, int ranks, const std::string& unit) {
  const int64_t share = global_batch / ranks;
  return "global batch " + str(global_batch) + " kept (" +
         (global_batch % ranks == 0 ? str(share) + " per " + unit + ")"
                                    : str(share) + " or " + str(share + 1) + " per " + unit +
                                          ", gradients weighted by share)");
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// An async_ps checkpoint of another layout, as both roles read it: the saved layout (its last
// saved_servers ranks served), server 0's state, and the parameters and BN statistics joined from
// the servers' shards (each server kept only its own shard of its stores up to date).
struct SavedPs {
  int workers = 0, servers = 0;
  comm::PsServerState state;
  std::vector<float> params, buffers;
};

SavedPs read_saved_ps(const LoadedCheckpoint& ck) {
  const std::string where = "checkpoint " + ck.path + ": ";
  const int64_t ranks = static_cast<int64_t>(ck.saved.size());
  SavedPs ps;
  ps.servers = ck.saved_servers;
  ps.workers = static_cast<int>(ranks) - ps.servers;
  if (ps.servers < 1 || ps.workers < 1)
    throw std::runtime_error(where + "not an async_ps checkpoint (" + str(ps.servers) + " of its " + str(ranks) +
                             " processes were servers)");
  std::vector<const std::vector<float>*> params, buffers;
  for (int s = 0; s < ps.servers; ++s) {
    params.push_back(&ck.saved[ps.workers + s].params);
    buffers.push_back(&ck.saved[ps.workers + s].buffers);
  }
  try {
    std::istringstream in(ck.saved[ps.workers].state.sync_state);
    ps.state = comm::PsServerState::read(in);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(where + "saved rank " + str(ps.workers) + ": " + e.what());
  }
  if (ps.state.workers != ps.workers || ps.state.servers != ps.servers)
    throw std::runtime_error(where + "its manifest names " + str(ps.servers) + " servers of " + str(ranks) +
                             " processes, its first server's state " + str(ps.state.servers) + " servers and " +
                             str(ps.state.workers) + " workers");
  ps.params = comm::join_shards(params);
  ps.buffers = comm::join_shards(buffers);
  return ps;
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
  // Rank 0 looks and every rank takes its answer: {found, world, global batch, servers}.
  int64_t seen[4] = {0, 0, 0, -1};
  if (comm.rank() == 0)
    if (auto ck = peek_checkpoint(output_dir(config), which))
      seen[0] = 1, seen[1] = ck->world_size, seen[2] = ck->global_batch, seen[3] = ck->servers;
  comm.broadcast(seen, 4, comm::DType::kI64, 0, "CHECKPOINT_LIST");
  const int64_t saved_world = seen[1], kept_batch = seen[2], world = comm.size();
  // async_ps: the batch is the workers' (the last sync.async_ps.servers ranks serve), and a checkpoint of
  // another number of servers is re-sharded too. -1: a checkpoint that did not record its servers.
  const bool ps = comm::sync_method(config.sync.method).can.applies_update;
  const int64_t servers = ps ? comm::server_ranks(config.sync) : 0, saved_servers = ps ? seen[3] : 0;
  const bool same_layout = saved_world == world && (saved_servers < 0 || saved_servers == servers);
  if (!seen[0] || (same_layout && kept_batch == 0)) return config;  // the exact resume (or load's error)
  if (saved_servers < 0 && saved_world != world)
    throw std::runtime_error("sync.method 'async_ps': the checkpoint was written by " + str(saved_world) +
                             " processes and does not record how many were servers (an older checkpoint); resume "
                             "it with " + str(saved_world) + " processes");
  const int64_t trainers = world - servers;
  const int64_t saved_trainers = saved_world - (saved_servers < 0 ? servers : saved_servers);
  if (trainers < 1) return config;  // no worker: PsLayout::make's error names sync.async_ps.servers (run.cpp)
  const std::string unit = ps ? (trainers == 1 ? " worker" : " workers") : " processes";
  // The global batch the checkpoint's steps were made of: one an earlier elastic resume kept, or
  // the configured per-process batch times the processes (async_ps: workers) that wrote it.
  const int64_t g = kept_batch > 0 ? kept_batch : config.data.batch_size * saved_trainers;
  if (g < trainers)
    throw std::runtime_error("the checkpoint's global batch of " + str(g) + " samples cannot be shared by " +
                             str(trainers) + unit + " (at most " + str(g) + ")");
  if (g % trainers != 0 && config.train.elastic_batch == "keep_global_even")
    throw std::runtime_error("train.elastic_batch = \"keep_global_even\": " + str(trainers) + unit +
                             " do not divide the checkpoint's global batch of " + str(g) +
                             " samples (keep_global shares it unevenly)");
  Config planned = config;
  planned.data.global_batch = g == config.data.batch_size * trainers ? 0 : g;
  return planned;
}

Resharded apply_resharded(const LoadedCheckpoint& ck, int world, models::ParameterStore& params,
                          models::ParameterStore& buffers, optim::Optimizer& optimizer, comm::GradientSync& sync,
                          int64_t global_batch) {
  const std::vector<SavedRank>& saved = ck.saved;
  const std::string p = str(static_cast<int64_t>(saved.size()));
  const std::string where = "checkpoint " + ck.path + ": ";
  const bool replicated = comm::sync_method(sync.name()).can.keeps_parameters_equal;
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

  const std::string weights =
      (params_equal ? "parameters equal on the " + p + " saved ranks, kept"
                    : "parameters: the mean of the " + p + " saved ranks' (they differed: " + sync.name() +
                          " between averaging steps)") +
      (optimizer_equal ? "; optimizer state equal, kept" : "; optimizer state: saved rank 0's (each rank kept its own)");
  const std::string stats = buffers.size() == 0 ? ""
                            : buffers_equal     ? "; BN statistics equal, kept"
                                                : "; BN statistics: the mean of the " + p + " saved ranks'";
  Resharded out;
  out.note = "re-sharded from " + p + " to " + str(world) + (world == 1 ? " process: " : " processes: ") +
             batch_note(global_batch, world, "process") + "; " + weights + stats + "; " + sync_note;
  out.epoch = saved[0].state.epoch;
  out.batch_in_epoch = saved[0].state.batch_in_epoch;
  return out;
}

Resharded apply_ps_worker_resharded(const LoadedCheckpoint& ck, const comm::PsLayout& layout,
                                    models::ParameterStore& params, models::ParameterStore& buffers,
                                    optim::Optimizer& optimizer, comm::GradientSync& sync, int64_t global_batch) {
  const SavedPs ps = read_saved_ps(ck);
  const std::vector<SavedRank>& saved = ck.saved;
  // Every worker pulled every shard at the checkpoint (a meet): its copy is the servers' shards joined.
  for (int w = 0; w < ps.workers; ++w)
    if (!same_bits(saved[w].params, ps.params) || !same_bits(saved[w].buffers, ps.buffers))
      throw std::runtime_error("checkpoint " + ck.path + ": saved worker " + str(w) +
                               " holds other parameters than the servers' shards (not a checkpoint at a meet)");
  // The workers' own state (the versions they pulled) first: it is the part that may still refuse.
  std::vector<std::string> states;
  for (int w = 0; w < ps.workers; ++w) states.push_back(saved[w].state.sync_state);
  const std::string sync_note = sync.load_resharded(states);
  std::istringstream opt(saved[0].state.optimizer_state);  // a worker's optimizer never runs (the servers' does)
  optimizer.load(opt);
  params.copy_values_from_host(ps.params.data(), ps.params.size() * sizeof(float));
  buffers.copy_values_from_host(ps.buffers.data(), ps.buffers.size() * sizeof(float));

  const auto [slowest, fastest] = std::minmax_element(ps.state.clocks.begin(), ps.state.clocks.end());
  const int64_t step = ck.state.step;
  Resharded out;
  out.note = "re-sharded from " + str(static_cast<int64_t>(saved.size())) + " to " + str(layout.world) +
             " processes (" + str(ps.workers) + " workers and " + str(ps.servers) + " to " + str(layout.workers) +
             " and " + str(layout.servers) + (layout.servers == 1 ? " server): " : " servers): ") +
             batch_note(global_batch, layout.workers, "worker") +
             "; the servers' shards of the parameters, BN statistics" +
             (ps.state.gap ? ", optimizer state and gap-aware averages" : " and optimizer state") +
             " joined and cut for " + str(layout.servers) +
             (layout.servers == 1 ? " server" : " servers") +
             "; every worker's clock (" + str(*slowest) + (*slowest == *fastest ? "" : " to " + str(*fastest)) +
             " steps at the checkpoint) restarted at the global step " + str(step) + ", its data position with it; " +
             sync_note;
  // The servers saved the global step's position; the workers saved their own clocks'.
  out.epoch = saved.back().state.epoch;
  out.batch_in_epoch = saved.back().state.batch_in_epoch;
  return out;
}

void apply_ps_server_resharded(const LoadedCheckpoint& ck, comm::ParameterServer& server,
                               models::ParameterStore& params, models::ParameterStore& buffers) {
  const SavedPs ps = read_saved_ps(ck);
  std::vector<std::string> optimizer_states, server_states;
  for (int s = 0; s < ps.servers; ++s) {
    const TrainingState& state = ck.saved[ps.workers + s].state;
    optimizer_states.push_back(state.optimizer_state);
    server_states.push_back(state.sync_state);
  }
  server.load_resharded(optimizer_states, server_states, ck.state.step);  // may refuse: the stores are untouched then
  params.copy_values_from_host(ps.params.data(), ps.params.size() * sizeof(float));
  buffers.copy_values_from_host(ps.buffers.data(), ps.buffers.size() * sizeof(float));
}

}  // namespace trainer::app
