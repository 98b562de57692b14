#include "comm/sync/methods/async_ps/async_ps_server.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "comm/sync/methods/async_ps/async_ps_state.h"
#include "comm/sync/methods/async_ps/staleness_remedies.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {
namespace {

// The server's arithmetic that the backend has no op for yet, on flat float buffers, one pass each
// (sums and scaling go through the backend's add and scale).
void add_scaled_into(float* y, const float* x, float a, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void subtract_from(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] -= x[i];
}
// DC-ASGD (Zheng et al. 2017): g + lambda g*g*(w_now - w_pulled), the diagonal approximation of the
// Hessian term of g(w_now) around w_pulled.
void delay_compensate(float* g, const float* w_now, const float* w_pulled, float lambda, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] += lambda * g[i] * g[i] * (w_now[i] - w_pulled[i]);
}

// The servers' optimizer with W workers and the lr factor: sync.async_ps.momentum_correction lowers SGD's
// momentum by asynchrony's implicit momentum (staleness_remedies.h); with max_staleness = 0 there is
// no asynchrony, and the servers run dense SGD's momentum.
std::pair<optim::OptimizerOptions, double> server_optimizer(const PsServerOptions& options, int workers) {
  optim::OptimizerOptions o = options.optimizer;
  double lr_factor = 1;
  if (options_of<AsyncPsOptions>(options.sync).momentum_correction != "none" && options_of<AsyncPsOptions>(options.sync).max_staleness != 0 && o.name == "sgd") {
    const double mu = options.optimizer.momentum;
    o.momentum = corrected_momentum(mu, workers);
    if (o.momentum == 0) o.nesterov = false;
    if (options_of<AsyncPsOptions>(options.sync).momentum_correction == "momentum_and_lr")
      lr_factor = (1.0 - o.momentum) / (1.0 - mu);  // keeps lr / (1 - momentum); optim.momentum < 1 (schema)
  }
  return {o, lr_factor};
}

}  // namespace

ParameterServer::ParameterServer(const PsServerOptions& options, Communicator& world, models::Backend& backend,
                                 models::ParameterStore& params, models::ParameterStore& buffers)
    : options_(options),
      ps_(options_of<AsyncPsOptions>(options.sync)),
      world_(world),
      backend_(backend),
      layout_(PsLayout::make(world.size(), ps_.servers)) {
  me_ = world.rank() - layout_.workers;
  n_ = params.size();
  std::tie(p0_, p1_) = PsLayout::shard(params.size(), layout_.servers, me_);
  std::tie(s0_, s1_) = PsLayout::shard(buffers.size(), layout_.servers, me_);
  params_ = params.values() + p0_;
  state_ = buffers.values() + s0_;
  optim::OptimizerOptions optimizer;
  std::tie(optimizer, lr_factor_) = server_optimizer(options, layout_.workers);
  optimizer_ = optim::make_optimizer(backend, optimizer, p1_ - p0_);
  if (options_of<AsyncPsOptions>(options.sync).staleness_lr == "gap") {
    gap_ = std::make_unique<GapAwareDamping>(p1_ - p0_);
    before_.resize(static_cast<size_t>(p1_ - p0_));
  }
  schedule_ = options.schedule;
  const size_t W = static_cast<size_t>(layout_.workers);
  clock_.assign(W, 0);
  waiting_.assign(W, false);
  tau_.assign(W, 0);
  grad_.resize(static_cast<size_t>(p1_ - p0_));
  state_in_.resize(static_cast<size_t>(s1_ - s0_));
  sum_grad_.assign(grad_.size(), 0.f);
  sum_state_.assign(state_in_.size(), 0.f);
  reply_headers_.resize(W * kReplyHeaderSize);
}

bool ParameterServer::synchronous(int64_t step) const {
  return ps_.max_staleness == 0 || step < options_.sync.dense_warmup_steps;
}

int64_t ParameterServer::next_meet(int64_t step) const {
  if (synchronous(step)) return step + 1;
  // The next multiple of each period, or the end.
  auto next_multiple = [&](int64_t period) { return period > 0 ? (step / period + 1) * period : end_; };
  const int64_t eval = next_multiple(options_.eval_every_steps > 0 ? options_.eval_every_steps : steps_per_epoch_);
  return std::min({end_, eval, next_multiple(options_.checkpoint_every)});
}

bool ParameterServer::may_grant(int w) const {
  const int W = layout_.workers;
  // Pushes granted so far: those received, and one outstanding for every worker computing (not waiting).
  const int64_t granted = received_ + std::count(waiting_.begin(), waiting_.end(), false);
  if (granted >= meet_ * W) return false;  // the meet's budget is given out: wait for it
  const int64_t slowest = *std::min_element(clock_.begin(), clock_.end());
  return ps_.max_staleness < 0 || clock_[w] - slowest <= ps_.max_staleness;
}

void ParameterServer::apply(float* grad, double lr, int w_for_dc) {
  // grad is grad_ or sum_grad_, both this server's scratch: DC-ASGD and gap-aware damping change it
  // in place. w_for_dc < 0: a synchronous step's mean, which nothing stale went into.
  if (w_for_dc >= 0 && ps_.staleness_lr == "dc")
    delay_compensate(grad, params_, sent_[w_for_dc].data(), static_cast<float>(ps_.dc_lambda), p1_ - p0_);
  if (gap_ && w_for_dc >= 0) {
    // Coupled weight decay is part of the gradient the optimizer forms, so it is damped too.
    const bool coupled = options_.optimizer.name != "adamw" && !options_.optimizer.decoupled_weight_decay;
    const float wd = coupled ? static_cast<float>(options_.optimizer.weight_decay) : 0.f;
    gap_->damp(grad, params_, sent_[w_for_dc].data(), wd);
    std::copy(params_, params_ + (p1_ - p0_), before_.begin());
  }
  lr *= lr_factor_;
  optimizer_->step(params_, grad, lr);
  if (gap_ && w_for_dc >= 0) gap_->observe(before_.data(), params_, lr);
  last_lr_ = lr;
  ++version_;
}

void ParameterServer::receive_push(int w, int64_t step, int64_t pulled_version) {
  const int W = layout_.workers;
  tau_[w] = version_ - pulled_version;
  subtract_from(state_in_.data(), sent_state_[w].data(), s1_ - s0_);  // the worker's change of the BN statistics
  const double lr = optim::learning_rate(schedule_, pushes_ / W, steps_per_epoch_, total_steps_);
  if (synchronous(step)) {
    backend_.add(p1_ - p0_, sum_grad_.data(), grad_.data(), sum_grad_.data());
    backend_.add(s1_ - s0_, sum_state_.data(), state_in_.data(), sum_state_.data());
  } else {
    // One push is 1/W of a synchronous step (which applies the mean of W gradients at lr), so the lr
    // and weight decay tuned for synchronous SGD carry over: W pushes at tau = 0 move the weights
    // as far as one dense step.
    const double push_lr = lr / W;
    apply(grad_.data(), ps_.staleness_lr == "inverse" ? push_lr / (1.0 + tau_[w]) : push_lr, w);
    // Each worker's change of the BN statistics counts 1/W: W pushes move them as far as the
    // average of W synchronous ranks' statistics would.
    add_scaled_into(state_, state_in_.data(), 1.f / static_cast<float>(W), s1_ - s0_);
    ++pushes_;
  }
  ++clock_[w];
  ++received_;
  waiting_[w] = true;
}

void ParameterServer::complete_meet() {
  const int W = layout_.workers;
  if (!synchronous(meet_ - 1)) return;  // every push of the meet was applied as it came
  // A synchronous step: the mean of its W gradients is one optimizer step.
  const double lr = optim::learning_rate(schedule_, pushes_ / W, steps_per_epoch_, total_steps_);
  const float inv = 1.f / static_cast<float>(W);
  backend_.scale(p1_ - p0_, inv, sum_grad_.data());  // as dense: the sum, then one scaling pass
  apply(sum_grad_.data(), lr, -1);
  add_scaled_into(state_, sum_state_.data(), inv, s1_ - s0_);
  std::fill(sum_grad_.begin(), sum_grad_.end(), 0.f);
  std::fill(sum_state_.begin(), sum_state_.end(), 0.f);
  pushes_ += W;
}

void ParameterServer::send_reply(int w, int64_t meet, std::vector<Request>& sends) {
  const int W = layout_.workers;
  int64_t* h = reply_headers_.data() + static_cast<size_t>(w) * kReplyHeaderSize;
  h[0] = version_;
  h[1] = tau_[w];
  std::memcpy(&h[2], &last_lr_, sizeof(double));
  h[kReplyGlobalStep] = (received_ + W - 1) / W;  // the step under way (at a meet: the meet)
  h[kReplyMeet] = meet;
  sends.push_back(world_.isend(h, kReplyHeaderSize, DType::kI64, w, kPsReplyChannel, "PS_HEADER"));
  sends.push_back(world_.isend(params_, p1_ - p0_, DType::kF32, w, kPsParamsChannel, "PULL_PARAMS"));
  sends.push_back(
      world_.isend(state_, s1_ - s0_, DType::kF32, w, kPsPulledStateChannel, "PULL_STATE"));
  if (!sent_.empty()) sent_[w].assign(params_, params_ + (p1_ - p0_));
  sent_state_[w].assign(state_, state_ + (s1_ - s0_));
  waiting_[w] = false;
}

void ParameterServer::grant(std::vector<Request>& sends) {
  // The slowest first (then rank order), so that a budget running out goes to whoever lags.
  std::vector<int> order;
  for (int w = 0; w < layout_.workers; ++w)
    if (waiting_[w]) order.push_back(w);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return clock_[a] < clock_[b]; });
  for (int w : order)
    if (may_grant(w)) send_reply(w, -1, sends);
}

int64_t ParameterServer::serve(int64_t first_step, int64_t stop_after,
                               const std::function<void(int64_t)>& checkpoint) {
  const int W = layout_.workers;
  const bool coordinator = me_ == 0;
  if (pushes_ != first_step * W)
    throw std::runtime_error("async_ps server: the checkpoint of step " + std::to_string(first_step) + " holds " +
                             std::to_string(pushes_) + " pushes, expected " + std::to_string(first_step * W));
  received_ = pushes_;
  // Every worker holds the server's shard now: the initial weights (checked identical) or the
  // checkpoint's (a checkpoint is a meet every worker has pulled).
  sent_state_.assign(W, std::vector<float>(state_, state_ + (s1_ - s0_)));
  if (ps_.staleness_lr == "dc" || gap_)
    sent_.assign(W, std::vector<float>(params_, params_ + (p1_ - p0_)));
  // A stop at or before the first step never comes (as for the workers): the run goes to its end.
  end_ = stop_after > first_step ? stop_after : INT64_MAX;
  if (total_steps_ > 0) {  // resumed: the plan is known
    end_ = std::min(end_, total_steps_);
    meet_ = next_meet(first_step);
  }
  if (first_step >= end_) return end_;
  int64_t header[kPushHeaderSize];
  std::vector<Request> sends, payload;
  for (;;) {
    // Whose push: whichever comes first, or (deterministic) the next worker in rank order that is
    // computing (not held).
    int source = kAnySource;
    if (ps_.deterministic) {
      while (waiting_[next_]) next_ = (next_ + 1) % W;
      source = next_;
      next_ = (next_ + 1) % W;
    }
    Request r = world_.irecv(header, kPushHeaderSize, DType::kI64, source, kPsHeaderChannel,
                                   "PS_HEADER");
    const int w = world_.wait_completion(r).peer;
    payload.clear();
    payload.push_back(world_.irecv(grad_.data(), p1_ - p0_, DType::kF32, w, kPsGradChannel, "PUSH_GRAD"));
    payload.push_back(
        world_.irecv(state_in_.data(), s1_ - s0_, DType::kF32, w, kPsStateChannel, "PUSH_STATE"));
    world_.wait_all(payload);
    const int64_t step = header[0];
    if (w < 0 || w >= W || step != clock_[w] || waiting_[w])
      throw std::runtime_error("async_ps server: rank " + std::to_string(w) + " pushed step " + std::to_string(step) +
                               ", expected step " + (w >= 0 && w < W ? std::to_string(clock_[w]) : "?") +
                               " (workers out of step: were they started with the same checkpoint?)");
    if (total_steps_ == 0) {  // the plan arrives with the first push (a resumed run has it from the checkpoint)
      total_steps_ = header[2];
      steps_per_epoch_ = header[3];
      end_ = std::min(end_, total_steps_);
      meet_ = next_meet(first_step);
    } else if (header[2] != total_steps_ || header[3] != steps_per_epoch_) {
      throw std::runtime_error("async_ps server: rank " + std::to_string(w) + " plans " + std::to_string(header[2]) +
                               " steps of " + std::to_string(header[3]) + " per epoch, the server " +
                               std::to_string(total_steps_) + " of " + std::to_string(steps_per_epoch_) +
                               " (train.epochs, train.max_steps or data.batch_size changed since the checkpoint?)");
    }
    world_.log().set_step(step, Phase::kDense);
    receive_push(w, step, header[1]);
    sends.clear();
    if (received_ == meet_ * W) {
      // The meet is complete (every push granted before it has arrived, so every worker waits at
      // the coordinator): the synchronous step's update, then every worker gets the meet's shard.
      complete_meet();
      for (int v = 0; v < W; ++v) send_reply(v, meet_, sends);
      world_.wait_all(sends);  // the replies read the shard: done before it changes again
      const int64_t m = meet_;
      const int64_t every = options_.checkpoint_every;
      if ((every > 0 && m % every == 0) || m == total_steps_) checkpoint(m);
      if (m >= end_) return end_;
      meet_ = next_meet(m);
      continue;
    }
    if (synchronous(step)) continue;  // held until the step's meet
    if (coordinator)
      grant(sends);
    else
      send_reply(w, -1, sends);
    world_.wait_all(sends);
  }
}

void ParameterServer::save(std::ostream& optimizer_out, std::ostream& state_out) const {
  optimizer_->save(optimizer_out);
  PsServerState state;
  state.workers = layout_.workers;
  state.servers = layout_.servers;
  state.version = version_;
  state.pushes = pushes_;
  state.total_steps = total_steps_;
  state.steps_per_epoch = steps_per_epoch_;
  state.next = next_;
  state.clocks = clock_;
  if (gap_) state.gap = *gap_;
  state.write(state_out);
}

void ParameterServer::load(std::istream& optimizer_in, std::istream& state_in) {
  optimizer_->load(optimizer_in);
  use_state(PsServerState::read(state_in));
}

void ParameterServer::use_state(PsServerState state) {
  if (state.workers != layout_.workers || state.servers != layout_.servers)
    throw std::runtime_error("async_ps state was saved with " + std::to_string(state.workers) + " workers and " +
                             std::to_string(state.servers) + " servers (servers), this run has " +
                             std::to_string(layout_.workers) + " and " + std::to_string(layout_.servers));
  if (state.gap.has_value() != static_cast<bool>(gap_))
    throw std::runtime_error(std::string("async_ps server state was saved ") + (state.gap ? "with" : "without") +
                             " staleness_lr = \"gap\", this run has it " + (gap_ ? "on" : "off"));
  if (gap_ && state.gap->size() != p1_ - p0_)
    throw std::runtime_error("async_ps gap-aware state: " + std::to_string(state.gap->size()) +
                             " elements, this shard has " + std::to_string(p1_ - p0_));
  version_ = state.version;
  pushes_ = state.pushes;
  total_steps_ = state.total_steps;
  steps_per_epoch_ = state.steps_per_epoch;
  next_ = static_cast<int>(state.next);
  clock_ = std::move(state.clocks);
  if (gap_) *gap_ = std::move(*state.gap);
}

void ParameterServer::load_resharded(const std::vector<std::string>& optimizer_states,
                                     const std::vector<std::string>& server_states, int64_t step) {
  const int saved_servers = static_cast<int>(server_states.size());
  std::vector<PsServerPart> saved(server_states.size());
  for (int s = 0; s < saved_servers; ++s) {
    std::istringstream state(server_states[s]), optimizer_state(optimizer_states[s]);
    saved[s].state = PsServerState::read(state);
    // The saved optimizer as that server ran it (its momentum depends on the saved number of
    // workers), only to read its per-element state.
    const auto [begin, end] = PsLayout::shard(n_, saved_servers, s);
    const optim::OptimizerOptions as_saved = server_optimizer(options_, saved[s].state.workers).first;
    auto optimizer = optim::make_optimizer(backend_, as_saved, end - begin);
    optimizer->load(optimizer_state);
    saved[s].optimizer = optimizer->element_state();
    saved[s].optimizer_steps = optimizer->step_count();
  }
  PsServerPart mine = split_ps_servers(join_ps_servers(saved), n_, layout_, me_, step);
  // SGD's corrected momentum depends on the number of workers and may be 0 on one side only: no
  // buffer to keep (it is dropped), or none saved (a zero buffer: the next update's buffer is then
  // that push's gradient, as a first step's would be).
  const size_t arrays = optimizer_->element_state().size();
  if (mine.optimizer.size() != arrays) mine.optimizer.assign(arrays, std::vector<float>(p1_ - p0_, 0.f));
  optimizer_->set_element_state(mine.optimizer, mine.optimizer_steps);
  use_state(std::move(mine.state));
}

}  // namespace trainer::comm
