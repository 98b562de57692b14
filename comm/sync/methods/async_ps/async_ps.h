// The asynchronous parameter server (sync.method = "async_ps"): the worker's side and the wire
// protocol both sides share. The server's side (optimizer, lr schedule, staleness, checkpoints)
// is comm/sync/methods/async_ps/async_ps_server.h (its role in the trainer: trainer/server_role.cpp);
// docs/architecture.md ("Roles") walks one step through both.
//
// Roles: of P ranks the last S (sync.async_ps.servers) are servers, the first W = P - S workers. The flat
// parameters (n) and the flat non-trainable state (BN statistics, n_state) are each cut into S
// contiguous shards; server s owns shard s of both.
//
// One worker step, per server s, all nonblocking and completed together:
//   worker -> server  PS_HEADER   int64[4]: step, the version it pulled, total steps, steps per epoch
//                     PUSH_GRAD   its gradient's shard s (float)
//                     PUSH_STATE  its BN statistics, shard s (float); the server adds their change
//                                 since it last sent them to this worker
//   server -> worker  PS_HEADER   int64[5]: the version now, the staleness tau of this push, the lr
//                                 applied (a double's bits), the global step under way, and the meet
//                                 this reply completes (-1: none; async_ps_server.h)
//                     PULL_PARAMS the parameters' shard s (float)
//                     PULL_STATE  the BN statistics' shard s (float)
// The server takes headers from whichever worker sends first (an any-source receive; or in rank
// order, round robin, with sync.async_ps.deterministic), then that worker's payload on separate channels
// (MPI keeps messages of one channel between one pair in order). The reply is the pull: the
// worker goes on from the parameters it gets back, without waiting for other workers, unless
// server 0 holds the reply (the stale synchronous parallel bound, or a meet: checkpoint,
// evaluation, end, synchronous steps). When server 0's reply completes a meet, every other
// server whose reply did not sends one more with the meet's shard.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/sync/gradient_sync.h"
#include "comm/sync/option_keys.h"
#include "models/device_memory.h"

namespace trainer::comm {

// sync.method = "async_ps"'s keys.
inline const std::vector<std::string> kStalenessLr = {"inverse", "none", "dc", "gap"};
inline const std::vector<std::string> kMomentumCorrections = {"none", "momentum", "momentum_and_lr"};
struct AsyncPsOptions {
  int64_t servers = 1;                           // the last `servers` ranks serve
  std::string staleness_lr = "none";             // kStalenessLr
  double dc_lambda = 0.04;                       // staleness_lr = "dc"
  std::string momentum_correction = "momentum";  // kMomentumCorrections (staleness_remedies.h)
  int64_t max_staleness = -1;                    // -1 unbounded, 0 synchronous (async_ps_server.h)
  bool deterministic = false;                    // serve workers in rank order

  template <class Keys>
  static void declare(Keys& k) {
    k.key("servers", &AsyncPsOptions::servers,
          "parameter servers, the last N ranks; each owns a contiguous shard of the flat parameters and BN "
          "statistics and runs the optimizer and lr schedule on it (must be below the number of processes). A "
          "fixed count, resumes included: a checkpoint of another number of processes or servers has its "
          "servers' shards (with their optimizer state) joined and cut for this many, and the workers restart "
          "at the global step.",
          closed(1, 1 << 20));
    k.key("staleness_lr", &AsyncPsOptions::staleness_lr,
          "how a server treats a gradient computed tau versions ago. A push is 1/W of a synchronous step (lr / W "
          "with W workers); then inverse (lr / W / (1 + tau)), none (lr / W), dc (DC-ASGD: g + dc_lambda "
          "g*g*(w_now - w_pulled) at lr / W), or gap (gap-aware damping, Barkai et al. 2020: each element of the "
          "gradient, and its weight decay, divided by 1 + |w_now - w_pulled| / C, C = the largest push lr times "
          "the RMS of the updates' direction (running average, decay 0.999), i.e. by 1 + how many average "
          "pushes the weight moved since the worker pulled it; at lr / W).",
          kStalenessLr);
    k.key("dc_lambda", &AsyncPsOptions::dc_lambda,
          "with staleness_lr = \"dc\", the compensation strength lambda.", closed(0, 1e6));
    k.key("momentum_correction", &AsyncPsOptions::momentum_correction,
          "asynchrony acts as extra momentum of about 1 - 1/W with W workers (Mitliagkas et al. 2016). none: the "
          "servers run optim.momentum; momentum: they run SGD at momentum mu_e = max(0, optim.momentum - (1 - "
          "1/W)); momentum_and_lr: that, and every update's lr times (1 - mu_e) / (1 - optim.momentum), so the "
          "steady-state step of a gradient, lr / (1 - momentum), stays the recipe's. Every update the servers "
          "make, synchronous rounds (the dense warmup) included, except with max_staleness = 0 (no "
          "asynchrony: no correction). SGD only: with adam and adamw it does not apply (they have no momentum to "
          "lower).",
          kMomentumCorrections);
    k.key("max_staleness", &AsyncPsOptions::max_staleness,
          "stale synchronous parallel bound s: a worker more than s steps ahead of the slowest waits (-1 = no "
          "bound). s = 0 is synchronous: the server averages each round's gradients into one optimizer step "
          "(dense SGD up to summation order).",
          at_least(-1));
    k.key("deterministic", &AsyncPsOptions::deterministic,
          "servers take the workers' pushes in rank order, round robin, instead of whichever arrives first: "
          "repeatable runs (resume is bit for bit) at the pace of the slowest worker.");
  }
};

// Who is who: validated once per run (throws std::invalid_argument naming sync.async_ps.servers).
struct PsLayout {
  int world = 0, servers = 0, workers = 0;
  static PsLayout make(int world_size, int64_t servers);
  bool is_server(int rank) const { return rank >= workers; }
  int server_rank(int s) const { return workers + s; }  // world rank of server s
  // Server s's contiguous part [begin, end) of n elements: sizes differ by at most one.
  static std::pair<int64_t, int64_t> shard(int64_t n, int parts, int s);
};

// Point-to-point channels (MPI tags) of the protocol; the clock ping-pong uses 30001.
constexpr int kPsHeaderChannel = 20101;
constexpr int kPsGradChannel = 20102;
constexpr int kPsStateChannel = 20103;
constexpr int kPsReplyChannel = 20104;
constexpr int kPsParamsChannel = 20105;
constexpr int kPsPulledStateChannel = 20106;

constexpr int kPushHeaderSize = 4;   // step, pulled version, total steps, steps per epoch
constexpr int kReplyHeaderSize = 5;  // version, tau, lr bits, global step, meet
constexpr int kReplyGlobalStep = 3;  // positions in the reply header
constexpr int kReplyMeet = 4;

// The worker's side: reduce() pushes this rank's gradient and BN-statistics change to every server
// and returns with the parameters and BN statistics the servers sent back in SyncBuffers::params and
// ::state (the optimizer ran on the servers: its spec says applies_update). SyncStats::staleness is the
// largest tau the servers reported for this push, SyncStats::lr the lr they applied,
// ::global_step the servers' step and ::round the meet this reply completes (-1: none): the
// worker evaluates, checkpoints and stops at meets, counted in global steps.
//
// On a device (runtime.device = "cuda") the worker's buffers are the device's and the servers' are
// host arrays (they run the optimizer on the CPU): the protocol runs over MPI on host copies. Each
// step copies the gradient and the BN statistics to the host before the push and the pulled
// parameters and statistics back after it, and nothing else: the parameters are never copied out,
// since the pull replaces them.
class AsyncPsWorker final : public GradientSync {
 public:
  // `world` is every rank (servers included): its MPI side carries the protocol. total_steps and
  // steps_per_epoch travel in every header so the servers run the same lr schedule and know when the
  // run ends. `memory`: where the SyncBuffers passed to reduce() live.
  AsyncPsWorker(Communicator& world, models::DeviceMemory& memory, const SyncOptions& options, int64_t n);
  std::string name() const override { return "async_ps"; }
  std::string describe() const override;
  // Every push carries the whole gradient (the servers, not the wire, decide what is stale).
  Phase phase(int64_t) const override { return Phase::kDense; }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  std::string overlap_plan() const override { return "none (async_ps pushes the whole gradient after backward)"; }
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  // Elastic resume (trainer/checkpoint/reshard.h): `states` are the saved workers' only (the servers' state is
  // comm/sync/methods/async_ps/async_ps_state.h's); each of this run's servers is at the version they all pulled.
  std::string load_resharded(const std::vector<std::string>& states) override;

 private:
  // The push and the pull on host buffers (reduce() stages a device's); state_out_ holds the
  // statistics to push.
  SyncStats exchange(SyncBuffers& b, int64_t step);

  Communicator& world_;
  models::DeviceMemory& memory_;
  SyncOptions options_;
  AsyncPsOptions ps_;  // options_'s own keys
  int64_t n_;
  PsLayout layout_;
  std::vector<int64_t> pulled_version_;  // per server: the version of the parameters this rank holds
  std::vector<float> state_out_;         // the BN statistics pushed (a copy: the pull overwrites them)
  // On a device: host copies of the gradient pushed and of the parameters and statistics pulled.
  std::vector<float> host_grads_, host_params_, host_state_;
};

}  // namespace trainer::comm
