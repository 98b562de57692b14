// An async_ps server's checkpointed state (comm/sync/methods/async_ps/async_ps_server.h), and the servers' state cut
// again for another layout: an elastic resume (trainer/checkpoint/reshard.h) on another number of processes
// or another sync.servers.
//
// Format "async_ps_server" version 3 (version 2 lacks the gap-aware part), beside the optimizer's
// own state: int64 workers, servers, version, pushes, total steps, steps per epoch, the
// deterministic mode's next worker; int64 clocks[workers]; uint8 1 when the gap-aware running
// average follows (GapAwareDamping::save), else 0.
//
// Re-sharding. A checkpoint is a meet: every push granted before it has been applied, every
// worker holds the meet's parameters, nothing is in flight. The servers' state is then the state of
// one model cut in S shards in parameter order: each shard's parameters, BN statistics, optimizer
// state per element (momentum; Adam's moments) and gap-aware running averages, plus counters every
// server shares (version, pushes, the plan, the optimizer's and the gap-aware state's step counts:
// every server applies every push). join_ps_servers concatenates the shards and checks the shared
// counters; split_ps_servers cuts the whole for server s of a new layout exactly as PsLayout::shard
// cuts a fresh run's, so the new shards joined give back the same bits.
// What belongs to one worker does not carry over, and need not: at a meet no push is pending and
// every worker's copy of the parameters is the meet's, so DC-ASGD's and gap-aware damping's
// per-worker copies start from the checkpoint's parameters (as on any resume). The workers'
// clocks restart at the global step (a worker of the new layout is no particular old one), the
// round-robin position at worker 0, and each worker's staleness at 0.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <vector>

#include "comm/sync/methods/async_ps/async_ps.h"
#include "comm/sync/methods/async_ps/staleness_remedies.h"

namespace trainer::comm {

struct PsServerState {
  int64_t workers = 0, servers = 0;
  int64_t version = 0;  // optimizer steps applied
  int64_t pushes = 0;   // gradients applied (a synchronous step counts W): the global step is pushes / W
  int64_t total_steps = 0, steps_per_epoch = 0;  // the workers' plan (0: no push seen yet)
  int64_t next = 0;                     // deterministic: the worker whose push is taken next
  std::vector<int64_t> clocks;          // per worker: steps pushed
  std::optional<GapAwareDamping> gap;   // staleness_lr = "gap"

  void write(std::ostream& out) const;
  // Throws std::runtime_error for another method's state, another version, or a truncated one.
  static PsServerState read(std::istream& in);
};

// One server's part as re-sharding sees it: the optimizer's per-element arrays over the server's
// elements (optim::Optimizer::element_state) and its step count, and the server's state.
struct PsServerPart {
  std::vector<std::vector<float>> optimizer;
  int64_t optimizer_steps = 0;
  PsServerState state;
};

// The S saved servers' parts, in server order, as one part over all n elements (state.servers = S,
// clocks as server 0 saved them). Throws std::runtime_error naming the first server whose shared
// counters differ from server 0's.
PsServerPart join_ps_servers(const std::vector<PsServerPart>& saved);

// Server s of `layout`'s part of a joined state over n elements, at the checkpoint's global step
// `step`: its shard of every per-element array, the shared counters, every worker's clock at
// `step`, pushes step x workers, the round robin at worker 0. Throws std::runtime_error when the
// joined pushes are not `step` global steps of the saved workers.
PsServerPart split_ps_servers(const PsServerPart& joined, int64_t n, const PsLayout& layout, int s, int64_t step);

// The whole of a sharded array from the saved servers' copies, in server order: server s of
// wholes.size() contributes its own shard (PsLayout::shard) of its copy, the rest of which it does
// not keep up to date.
std::vector<float> join_shards(const std::vector<const std::vector<float>*>& wholes);

}  // namespace trainer::comm
