// The server side of sync.method = "async_ps" (the wire protocol and the worker's side are
// comm/sync/methods/async_ps/async_ps.h; the server role's start-up and checkpoints are trainer/server_role.cpp).
// A server rank holds the model's flat parameters and BN statistics, of which
// it owns one contiguous shard, runs the optimizer and the lr schedule on that shard, and answers
// the workers' pushes until every worker has pushed its last step.
//
// Staleness: the server's version counts its optimizer steps; a push computed on version v and
// arriving at version V has tau = V - v. One push is applied as 1/W of a synchronous step, at lr / W
// (W pushes at tau = 0 move the weights as far as one dense step of their mean), and
// sync.async_ps.staleness_lr decides what tau does: inverse (lr / W / (1 + tau)), none, dc (DC-ASGD: g +
// lambda g*g*(w_now - w_pulled), with w_pulled the shard this worker was last sent) or gap
// (gap-aware damping, staleness_remedies.h). sync.async_ps.momentum_correction lowers the optimizer's momentum
// by asynchrony's implicit momentum (staleness_remedies.h). The lr schedule
// runs on pushes / W (one "step" is one push per worker, as in the synchronous methods).
//
// The run's length is a budget of pushes, not a step count per worker: the run's T steps are
// T x W pushes from whichever workers push them, so a fast worker takes more steps than a
// straggler (what asynchrony is for). The global step is pushes / W, and it is what the lr
// schedule, evaluation, checkpoints and the end are counted in.
//
// Meets: at some global steps every worker must arrive and get the same parameters:
//   - checkpoint, evaluation and final steps (a checkpoint is one consistent cut: servers save
//     shard, optimizer, versions and clocks; workers the parameters they hold, loader position,
//     pulled versions; evaluation sees one set of weights);
//   - every synchronous step (sync.async_ps.max_staleness = 0, or within sync.dense_warmup_steps): the server
//     sums the step's W gradients and applies their mean as one optimizer step, which is dense
//     synchronous SGD up to the order of the sum.
// Server 0 (the coordinator) grants pushes: its reply to a push lets the worker compute the next,
// and it sends no more replies than leave exactly meet x W pushes before the meet; it also holds a
// worker more than sync.async_ps.max_staleness pushes ahead of the slowest (stale synchronous parallel; -1 =
// no bound). The other servers reply at once between meets (their decisions would depend on the
// order pushes reach them, which differs between servers) and send every worker one more reply when
// the meet is complete, so every worker leaves a meet with the meet's parameters of every shard.
// Every reply's header names the meet it completes, so a worker knows when to evaluate, checkpoint
// or stop without counting anything itself.
// With sync.async_ps.deterministic the server takes pushes in rank order, round robin, so the order of
// updates (and with it every bit of the run) does not depend on timing.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sync/methods/async_ps/async_ps.h"
#include "comm/sync/methods/async_ps/async_ps_state.h"
#include "comm/sync/methods/async_ps/staleness_remedies.h"
#include "models/parameters.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace trainer::comm {

// What a server needs to know besides the sync keys: where the meets fall (train.eval_every_steps,
// train.checkpoint_every) and the optimizer and lr schedule it runs for the workers.
struct PsServerOptions {
  SyncOptions sync;  // dense_warmup_steps and the method's keys (AsyncPsOptions)
  int64_t eval_every_steps = 0;  // 0: every epoch end
  int64_t checkpoint_every = 0;  // 0: none but the last
  optim::OptimizerOptions optimizer;
  optim::ScheduleOptions schedule;
};

class ParameterServer {
 public:
  // params and buffers: the whole model (only this server's shards are read and written), on
  // `backend`, which also runs the shard's optimizer.
  ParameterServer(const PsServerOptions& options, Communicator& world, models::Backend& backend,
                  models::ParameterStore& params, models::ParameterStore& buffers);

  // Serves from global step `first_step` (0, or the checkpoint's) until the meet at the end: the
  // run's total steps (learned from the workers' headers) or `stop_after` when that is earlier.
  // `checkpoint(step)` runs (collectively with the workers) when a checkpoint meet is complete and
  // its replies are sent. Returns the end.
  int64_t serve(int64_t first_step, int64_t stop_after, const std::function<void(int64_t)>& checkpoint);

  // Optimizer state and the server's own (versions, pushes, schedule plan), for checkpoints.
  void save(std::ostream& optimizer_out, std::ostream& state_out) const;
  void load(std::istream& optimizer_in, std::istream& state_in);
  // Elastic resume from a checkpoint of another layout (comm/sync/methods/async_ps/async_ps_state.h): the saved
  // servers' optimizer and server states, in server order, joined and cut for this server, every
  // worker's clock at the checkpoint's global step `step`. The stores must already hold the joined
  // parameters and BN statistics. Throws std::runtime_error naming what does not match.
  void load_resharded(const std::vector<std::string>& optimizer_states, const std::vector<std::string>& server_states,
                      int64_t step);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  void use_state(PsServerState state);  // a loaded state, checked against this server's layout
  bool synchronous(int64_t step) const;
  // The first meet after global step `step`: the next step when it is synchronous, else the next
  // checkpoint, evaluation (or epoch end) or final step.
  int64_t next_meet(int64_t step) const;
  bool may_grant(int w) const;             // coordinator: may worker w push once more now?
  void receive_push(int w, int64_t step, int64_t pulled_version);
  void complete_meet();                   // a synchronous step's mean applied
  void apply(float* grad, double lr, int w_for_dc);
  void grant(std::vector<Request>& sends);
  void send_reply(int w, int64_t meet, std::vector<Request>& sends);

  PsServerOptions options_;
  AsyncPsOptions ps_;  // options_.sync's async_ps keys
  Communicator& world_;
  models::Backend& backend_;
  PsLayout layout_;
  int me_ = 0;                       // this server's index, 0..S-1
  int64_t n_ = 0;                    // the model's parameters
  int64_t p0_ = 0, p1_ = 0;          // its parameter shard
  int64_t s0_ = 0, s1_ = 0;          // its BN-statistics shard
  float* params_;                    // shard start
  float* state_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::ScheduleOptions schedule_;
  int64_t version_ = 0;   // optimizer steps applied
  int64_t pushes_ = 0;    // gradients applied (a synchronous step counts W): the schedule's step is pushes / W
  int64_t received_ = 0;  // gradients received (pushes_ plus a synchronous step's partial sum); global step = received_ / W
  int64_t total_steps_ = 0, steps_per_epoch_ = 0;  // from the workers' headers (0: none seen yet)
  int64_t end_ = 0;   // the global step the run ends at
  int64_t meet_ = 0;  // the next meet (global step); valid once the plan is known
  double last_lr_ = 0;
  double lr_factor_ = 1;  // momentum_correction = "momentum_and_lr": keeps lr / (1 - momentum)
  std::vector<int64_t> clock_;  // per worker: steps pushed
  std::vector<bool> waiting_;   // per worker: pushed, reply held
  std::vector<int64_t> tau_;    // per worker: staleness of its last push
  std::vector<float> grad_, state_in_, sum_grad_, sum_state_;  // one push; a synchronous step's sums
  std::vector<std::vector<float>> sent_;        // dc, gap: per worker, the parameter shard it was last sent
  std::unique_ptr<GapAwareDamping> gap_;        // staleness_lr = "gap"
  std::vector<float> before_;                   // gap: the shard before an update (its step is observed)
  std::vector<std::vector<float>> sent_state_;  // per worker, the BN-statistics shard it was last sent
  std::vector<int64_t> reply_headers_;  // per worker: its reply's header, valid until the send completes
  int next_ = 0;  // deterministic: the worker whose push is taken next
};

}  // namespace trainer::comm
