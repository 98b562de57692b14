// A training rank: the step loop, made of the parts of trainer/: the step clock (step_clock.h), the
// update rule (update_rule.h), the interval metrics, the checkpoint keeper, the non-finite guard, the
// divergence guard and the trace spans. docs/architecture.md section 2 walks one step.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/comm_summary.h"
#include "comm/sync/registry.h"
#include "optim/schedule.h"
#include "trainer/agreed_error.h"
#include "trainer/checkpoint/checkpoint_keeper.h"
#include "trainer/step/divergence_guard.h"
#include "trainer/experiment.h"
#include "trainer/step/interval_metrics.h"
#include "trainer/step/nonfinite_guard.h"
#include "trainer/checkpoint/preemption.h"
#include "trainer/checkpoint/reshard.h"
#include "trainer/roles.h"
#include "trainer/run_output.h"
#include "trainer/config/config_sync.h"
#include "trainer/start_notes.h"
#include "trainer/step/step_clock.h"
#include "trainer/step/step_graph.h"
#include "trainer/step/trace_spans.h"
#include "trainer/step/fault_injection.h"
#include "trainer/step/update_rule.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
std::string str(int64_t v) { return std::to_string(v); }

// Speech batches differ in length, so every step allocates activations and workspaces of new sizes.
// main.cpp keeps glibc from mapping and unmapping large blocks (mmap off, 1 GB trim threshold: Open
// MPI's message-sized temporaries must stay resident), and then every freed hole stays resident
// too: DeepSpeech at batch 2 grew by about 35 MB a step (1.8 GB at step 5, 3.3 GB at step 40; flat
// at 1.6 GB under jemalloc, so fragmentation, not a leak). Each time the heap has grown by another
// kRegrowth since the last trim, the pages of its free chunks go back to the system. Fixed-shape
// models stop growing after their first steps and are never trimmed again, so their steady-state
// buffers are not re-faulted (trimming every step cost the small LAS 30 ms a step).
void release_free_heap() {
  constexpr size_t kRegrowth = size_t{256} << 20;
  static size_t heap_at_last_trim = mallinfo2().arena;
  const size_t heap = mallinfo2().arena;
  if (heap < heap_at_last_trim + kRegrowth) return;
  malloc_trim(0);
  heap_at_last_trim = mallinfo2().arena;
}

// The straggler knob (runtime.slowdown): this rank sleeps (factor - 1) times the step's own work.
void slow_down(const Config& config, int rank, double step_ms) {
  if (rank != config.runtime.slowdown_rank || config.runtime.slowdown_factor <= 1) return;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>((config.runtime.slowdown_factor - 1) * step_ms));
}

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "a signal";
}

class Worker {
 public:
  Worker(const Config& config, const RunOptions& options, comm::Communicator& world, comm::Communicator& training,
         int threads, Clock::time_point run_start);
  RunSummary run();

 private:
  // One step; returns false when the run stops after it: its end, or early (a stop signal,
  // --stop-after: the comm log is finished, there is no summary).
  bool step(int64_t step);
  // The start of either kind of step: its batch loaded (timed as data), the injected failure.
  // Returns when the step started.
  Clock::time_point begin_step(int64_t step);
  // An eager step's forward and backward; with sync.overlap the method's first messages (dense
  // buckets) go out during backward, from gradients_ready.
  struct Backward {
    StepResult result;
    bool early = false;              // the method sent during backward (finish_early_sends)
    int64_t from_us = 0, to_us = 0;  // backward's span, for the comm log
  };
  Backward forward_backward(int64_t step);
  // The verdict on stop requests and non-finite values, found before the sync can spread them into
  // other ranks' weights or residuals: of the local gradient as it is, or as its buckets went out.
  StepVerdict agree(int64_t step, const Backward& backward);
  // The same step as one CUDA graph (runtime.cuda_graph, step_graph.h): false as step(); nothing
  // when the step could not be recorded (the graph is dropped, and the step runs eager).
  std::optional<bool> graph_step(int64_t step);
  // The launched steps' results, each closed by close_step as an eager step is; `stop_signal`: the
  // agreed signal of the last one.
  bool drain_graph(int stop_signal);

  // What a step, eager or replayed from its recording, leaves to close.
  struct FinishedStep {
    int64_t step = 0;
    double loss = 0;
    int64_t samples = 0;
    int64_t correct = 0;
    bool applied = false;
    comm::SyncStats stats;
    double lr = 0;
    // Not applied: what was not finite, and whether every rank knows it (the verdict's or the
    // device's check after the sync), which lets the divergence guard judge it; whether the
    // parameters were restored (a recorded step's own check), and whether only the loss was.
    std::string nonfinite;
    bool agreed_nonfinite = false;
    bool restored = false;
    bool loss_only = false;
  };
  // The one end of every step: the non-finite guard, the step's metrics, the divergence guard (a
  // stop checkpoints the state after `state_done` steps: the last drained one's, for a recording),
  // then round_duties. Returns false when the run stops.
  bool close_step(const FinishedStep& s, int64_t state_done, int stop_signal);
  // What falls due when `round` steps are done. One rule for round_duties and for whether a
  // recorded step must hand its results over first (a launched step is drained before any duty).
  struct Duties {
    bool evaluate = false, checkpoint = false, finished = false, stop_after = false;
    bool any() const { return evaluate || checkpoint || finished || stop_after; }
  };
  Duties duties(int64_t round) const;
  bool log_due(int64_t done, int64_t round) const {
    return done % config_.train.log_every_steps == 0 || round == total_steps_;
  }
  // After the `done`-th step, at `at`: evaluation, checkpoint and the end when the round is due,
  // and stopping early (a stop signal agreed on, --stop-after). Returns false when the run stops.
  bool round_duties(int64_t done, const StepPosition& at, int stop_signal);
  void evaluate(int64_t round, int64_t epoch);
  void checkpoint(int64_t round, int64_t done, bool must_succeed);
  RunSummary finish();
  // A transfer the sync method keeps running across steps is completed and logged, then the comm log
  // is finished (the run's end, or a stop).
  void end_comm_log() {
    e_.sync->complete_in_flight();
    finish_comm_log(config_, world_, spans_.spans());
  }
  void say(const std::string& text) {
    if (lead_) progress_.line(text);
  }
  // Uneven shares of the global batch (an elastic resume, trainer/checkpoint/reshard.h): the gradient entries
  // from `from` on, final now, are weighted by share x ranks / G before any of them leaves, so that
  // the average over ranks is the mean over the G samples.
  void weight_gradient(int64_t from) {
    if (gradient_weight_ == 1.0f || from >= weighted_from_) return;
    e_.backend->scale(weighted_from_ - from, gradient_weight_, task_.parameters().grads() + from);
    weighted_from_ = from;
  }
  void resume(const LoadedCheckpoint& ck);
  // The divergence guard's stop: the checkpoint of the `done`-th step when `write` (a finite
  // state), the "diverged" record in metrics.jsonl, then the error every rank throws alike.
  [[noreturn]] void stop_diverged(const std::string& what, int64_t done, bool write);

  const Config& config_;
  const RunOptions& options_;
  comm::Communicator& world_;
  comm::Communicator& training_;
  const int rank_;
  const bool lead_;
  // The method applies the update itself (async_ps: its servers run the optimizer; the method
  // table's applies_update), decided once: this worker's update rule sends the gradient and takes
  // the parameters back, its clock is the one the servers grant, and a resume on another layout
  // re-shards the servers' shards.
  const bool remote_update_;
  Progress progress_;
  Experiment e_;
  Task& task_;
  comm::SyncBuffers sync_buffers_;
  const int64_t steps_per_epoch_, total_steps_;
  FaultInjection faults_;  // what tests ask for (trainer/step/fault_injection.h)
  const float gradient_weight_;
  int64_t weighted_from_ = 0;  // gradient entries [weighted_from_, n) are weighted this step
  std::unique_ptr<StepClock> clock_;
  std::unique_ptr<UpdateRule> update_;
  CheckpointKeeper keeper_;
  NonfiniteGuard guard_;
  std::unique_ptr<DivergenceGuard> divergence_;
  TraceSpans spans_;
  std::unique_ptr<StepGraph> graph_;  // null: eager steps only
  int64_t graph_samples_ = 0;         // the batch of the eager steps before it (static shapes)
  bool graph_announced_ = false;
  std::unique_ptr<MetricsWriter> writer_;
  std::unique_ptr<IntervalMetrics> metrics_;
  RunFrame frame_;
  double kept_reference_ = 0;  // the divergence guard's reference from a resumed checkpoint
  int64_t kept_reference_end_ = -1;
  double kept_start_ = std::numeric_limits<double>::quiet_NaN();  // and its start
  int64_t first_clock_ = 0;  // the steps this rank had taken at the start: its loader position
                             // (async_ps workers take different numbers of steps)
  RunSummary summary_;
  bool stopped_early_ = false;
  nlohmann::json last_eval_;
};

Worker::Worker(const Config& config, const RunOptions& options, comm::Communicator& world,
               comm::Communicator& training, int threads, Clock::time_point run_start)
    : config_(config),
      options_(options),
      world_(world),
      training_(training),
      rank_(world.rank()),
      lead_(world.rank() == 0),
      remote_update_(comm::sync_method(config.sync.method).can.applies_update),
      // Under mpiexec a rank's stdout is a pseudo-terminal even when the job's output goes to a
      // file, so the live line is only used by a process started directly from a terminal.
      progress_(lead_ && world.size() == 1 && Progress::stdout_is_terminal()),
      e_(build_experiment(config, world, training, [this](const std::string& text) { say(text); })),
      task_(*e_.task),
      sync_buffers_{task_.parameters().values(), task_.parameters().grads(), task_.parameters().size(),
                    task_.buffers().values(),    task_.buffers().size(),   &task_.parameters().views()},
      steps_per_epoch_(task_.steps_per_epoch()),
      total_steps_(app::total_steps(config, steps_per_epoch_)),
      faults_(rank_, options.fail_rank, options.fail_step),
      gradient_weight_(static_cast<float>(static_cast<double>(batch_share(config, training.size(), training.rank())) *
                                          training.size() / global_batch(config, training.size()))),
      clock_(remote_update_ ? make_granted_clock(rank_, training.size(), config.data.batch_size, *e_.backend,
                                                 task_.parameters())
                            : make_lockstep_clock(world, *e_.backend, task_.parameters())),
      update_(make_update_rule(remote_update_, *e_.sync, *e_.optimizer, *e_.backend, task_.parameters(),
                               sync_buffers_, trainer_clip_norm(config))),
      keeper_(config, task_.parameters(), task_.buffers(), world),
      guard_(config.train.skip_nonfinite_steps, task_.buffers(), [this] { return keeper_.last_note(); }),
      spans_(world.log(), config.comm.trace_first_step, config.comm.trace_steps) {
  task_.set_gradient_ready([this](int64_t from) {
    faults_.gradient_final(from, task_.parameters(), *e_.backend);
    weight_gradient(from);
    e_.sync->gradients_ready(from);
  });
  const std::string out = output_dir(config);
  frame_.run_start = run_start;
  frame_.total_steps = total_steps_;
  frame_.steps_per_epoch = steps_per_epoch_;
  frame_.classifies = task_.classifies();
  if (auto ck = keeper_.start(options.resume)) {
    resume(*ck);
  } else if (lead_) {
    std::ofstream(out + "/metrics.jsonl", std::ios::trunc);
  }
  if (lead_) {
    writer_ = std::make_unique<MetricsWriter>(out + "/metrics.jsonl");
    write_run_info(out + "/run.json", config, task_.parameters(), world.size(), total_steps_, steps_per_epoch_,
                   frame_.first_step);
  }
  const std::string batch = config.data.global_batch > 0
                                ? "global batch " + str(config.data.global_batch) + " over " + str(training.size())
                                : "batch " + str(config.data.batch_size) + " x " + str(training.size());
  char line[512];
  std::snprintf(line, sizeof line,
                "trainer: %s: %s (%lld parameters) on %lld training examples, steps %lld..%lld of %s "
                "processes, %d threads each, precision %s, sync %s; output in %s",
                config.experiment.name.c_str(), config.model.arch.c_str(),
                static_cast<long long>(task_.parameters().size()), static_cast<long long>(task_.train_examples()),
                static_cast<long long>(frame_.first_step), static_cast<long long>(total_steps_), batch.c_str(), threads,
                config.runtime.precision.c_str(), config.sync.method.c_str(), out.c_str());
  say(line);
  // The defaults this method chose for the recipe (its spec's), then the measured warnings.
  for (const std::string& line : method_default_lines(e_.sync_options)) say("default: " + line);
  for (const std::string& note : start_notes(config, e_.sync_options)) say(note);
  // Only ranks that take their steps together can agree on a window (not async_ps's workers).
  const auto compressed_at = [this](int64_t s) { return e_.sync->phase(s) == comm::Phase::kCompressed; };
  const int64_t switch_at = &world == &training ? switch_step(config, compressed_at) : -1;
  divergence_ = std::make_unique<DivergenceGuard>(config, switch_at, frame_.first_step, training, kept_reference_,
                                                  kept_reference_end_, kept_start_);
  const auto refusal = update_->recordable()
                           ? cuda_graph_refusal(config, *e_.backend, task_, e_.sync_on_device, training.size())
                           : std::optional<std::string>("");
  if (!refusal)
    graph_ = std::make_unique<StepGraph>(*e_.backend, task_, *update_, *e_.optimizer, sync_buffers_, world.log(),
                                         config.train.skip_nonfinite_steps > 0);
  else if (!refusal->empty())
    say(*refusal);
}

void Worker::resume(const LoadedCheckpoint& ck) {
  if (!ck.warning.empty()) say("warning: " + ck.warning);
  // run_training planned the global batch from the checkpoint it saw first; "latest" may have
  // fallen back past a damaged one to a checkpoint of other steps. (Only where a global batch was
  // kept or is to be: an exact resume, async_ps's included, has nothing to check.)
  const bool elastic = !ck.saved.empty() || ck.state.global_batch > 0 || config_.data.global_batch > 0;
  const int64_t saved_trainers = ck.saved_world - std::max(ck.saved_servers, 0);  // async_ps: its workers
  const int64_t saved = ck.state.global_batch > 0 ? ck.state.global_batch : config_.data.batch_size * saved_trainers;
  const int64_t planned = global_batch(config_, training_.size());
  if (elastic && saved != planned)
    throw AgreedError("checkpoint " + ck.path + " holds steps of " + str(saved) + " samples, but this run was set up for " +
                          str(planned) + " from a newer checkpoint that is damaged; resume with --resume " + ck.path,
                      1);
  Resharded resharded{"", ck.state.epoch, ck.state.batch_in_epoch};
  if (ck.saved.empty()) {
    std::istringstream opt_state(ck.state.optimizer_state), sync_state(ck.state.sync_state);
    e_.optimizer->load(opt_state);
    e_.sync->load(sync_state);
  } else if (remote_update_) {
    resharded = apply_ps_worker_resharded(ck, comm::PsLayout::make(world_.size(), comm::server_ranks(config_.sync)),
                                          task_.parameters(), task_.buffers(), *e_.optimizer, *e_.sync,
                                          global_batch(config_, training_.size()));
  } else {
    resharded = apply_resharded(ck, training_.size(), task_.parameters(), task_.buffers(), *e_.optimizer, *e_.sync,
                                global_batch(config_, training_.size()));
  }
  frame_.first_step = ck.state.step;
  kept_reference_ = ck.state.divergence_reference;
  kept_reference_end_ = ck.state.divergence_reference_end;
  kept_start_ = ck.state.divergence_start;
  first_clock_ = resharded.epoch * steps_per_epoch_ + resharded.batch_in_epoch;
  task_.seek(resharded.epoch, resharded.batch_in_epoch);
  if (lead_) truncate_metrics(output_dir(config_) + "/metrics.jsonl", frame_.first_step);
  say("resumed from " + ck.path + " at step " + str(frame_.first_step));
  if (!resharded.note.empty()) say(resharded.note);
}

RunSummary Worker::run() {
  frame_.train_start = Clock::now();
  metrics_ = std::make_unique<IntervalMetrics>(frame_, *clock_, writer_.get(), &progress_);
  if (config_.train.eval_at_start && frame_.first_step == 0) evaluate(0, 0);
  if (frame_.first_step < total_steps_)
    for (int64_t s = first_clock_; step(s); ++s) {
    }
  return stopped_early_ ? summary_ : finish();
}

bool Worker::step(int64_t step) {
  if (graph_ && graph_->ready())
    if (const std::optional<bool> go_on = graph_step(step)) return *go_on;  // else it runs eager, below
  const auto step_start = begin_step(step);
  const Backward backward = forward_backward(step);
  slow_down(config_, rank_, ms_since(step_start));
  const StepVerdict verdict = agree(step, backward);
  const double lr = optim::learning_rate(e_.schedule, step, steps_per_epoch_, total_steps_);
  UpdateOutcome update;
  if (verdict.nonfinite)
    update.nonfinite = nonfinite_item(verdict.tensor, task_.parameters()) + " on rank " +
                       std::to_string(verdict.rank) + ", before the gradient sync";
  else
    update = update_->run(step, lr, metrics_->times(), spans_);
  spans_.end_step();
  release_free_heap();
  if (graph_) {
    graph_->eager_step_done();
    graph_samples_ = backward.result.samples;
  }
  FinishedStep s;
  s.step = step;
  s.loss = backward.result.loss;
  s.samples = backward.result.samples;
  s.correct = backward.result.correct;
  s.applied = update.applied;
  s.stats = update.stats;
  s.lr = lr;
  s.nonfinite = update.nonfinite;
  // Only a value every rank knows of (the verdict's; its extra collective must not wait alone).
  s.agreed_nonfinite = verdict.nonfinite;
  s.loss_only = verdict.tensor < 0;
  return close_step(s, step + 1, verdict.stop_signal);
}

Worker::Backward Worker::forward_backward(int64_t step) {
  const auto t0 = Clock::now();
  world_.log().set_step(step, e_.sync->phase(step));
  guard_.before_forward();
  faults_.arm(step);
  weighted_from_ = task_.parameters().size();
  Backward b;
  b.early = e_.sync->begin_step(sync_buffers_, step);
  b.from_us = world_.log().now_us();
  b.result = task_.forward_backward();
  faults_.gradient_final(0, task_.parameters(), *e_.backend);
  weight_gradient(0);
  e_.backend->synchronize();  // backward's kernels count here, not in the phase that waits next
  b.to_us = world_.log().now_us();
  metrics_->times().compute += ms_since(t0);
  spans_.mark("forward_backward");
  return b;
}

StepVerdict Worker::agree(int64_t step, const Backward& b) {
  const auto t0 = Clock::now();
  const int sent_check = b.early ? e_.sync->finish_early_sends() : kNotSentYet;
  // Recorded only now: until finish_early_sends returns, the communication thread may be recording
  // its last buckets, and the log takes one recording thread at a time (comm/comm_log.h). Readers
  // place the span by its times, not by its line.
  world_.log().record_compute("FORWARD_BACKWARD", b.from_us, b.to_us);
  const StepVerdict verdict = clock_->verdict(step, stop_signal_received(), b.result.loss, sent_check);
  metrics_->times().sync += ms_since(t0);
  return verdict;
}

bool Worker::close_step(const FinishedStep& s, int64_t state_done, int stop_signal) {
  if (s.applied) {
    guard_.applied();
  } else {
    // A non-finite value after the switch that ends the run is the divergence guard's to judge.
    if (s.agreed_nonfinite && guard_.next_skip_ends_run())
      if (auto line = divergence_->nonfinite(s.step, s.loss, s.samples, s.loss_only,
                                             "non-finite value at step " + str(s.step) + ": " + s.nonfinite))
        stop_diverged(*line, s.step, false);
    say(guard_.skip(s.step, s.nonfinite, s.restored));
  }
  StepRecord record{s.loss, s.samples, s.correct, s.applied, s.stats, s.lr};
  world_.log().take_totals(record.sent, record.received);
  const int64_t done = s.step + 1;
  const StepPosition at = clock_->position(done, s.stats);
  metrics_->close_step(record, at, log_due(done, at.round));
  if (auto line = divergence_->after_step(s.step, s.loss, s.samples, s.applied, keeper_.last()))
    stop_diverged(*line, state_done, true);
  return round_duties(done, at, stop_signal);
}

Clock::time_point Worker::begin_step(int64_t step) {
  const auto step_start = Clock::now();
  spans_.begin_step(step);
  task_.load_batch();
  metrics_->times().data += ms_since(step_start);
  spans_.mark("data");
  faults_.step_starts(step);
  return step_start;
}

std::optional<bool> Worker::graph_step(int64_t step) {
  StepTimes& times = metrics_->times();
  const auto step_start = begin_step(step);
  const auto t0 = Clock::now();
  world_.log().set_step(step, e_.sync->phase(step));
  faults_.disarm();  // the graph's poison does it
  weighted_from_ = task_.parameters().size();
  // Deterministic, so every rank records or gives up alike, before the step's control message.
  const std::string failed = graph_->record_if_needed(step, [this] { weight_gradient(0); });
  if (!failed.empty()) {
    say("runtime.cuda_graph: eager steps from step " + str(step) + ": the step could not be recorded: " + failed);
    graph_.reset();
    task_.seek(step / steps_per_epoch_, step % steps_per_epoch_);  // the batch again, for the eager step
    spans_.end_step();
    return std::nullopt;
  }
  if (!graph_announced_) say(graph_->describe() + ", from step " + str(step));
  graph_announced_ = true;
  // Stop signals are agreed as in every step; the non-finite verdict is the graph's (no read here).
  const StepVerdict verdict = clock_->verdict(step, stop_signal_received(), 0.0, -1);
  const double lr = optim::learning_rate(e_.schedule, step, steps_per_epoch_, total_steps_);
  graph_->launch(step, lr, graph_samples_, faults_.nan_at(step));
  // The device's time lands here when the drain waits for it: the whole step is compute.
  times.compute += ms_since(t0);
  spans_.mark("step_graph");
  spans_.end_step();
  slow_down(config_, rank_, ms_since(step_start));
  const int64_t done = step + 1;
  if (!verdict.stop_signal && !graph_->full() && !log_due(done, done) && !duties(done).any()) return true;
  return drain_graph(verdict.stop_signal);
}

bool Worker::drain_graph(int stop_signal) {
  const auto t0 = Clock::now();
  const std::vector<GraphStepResult> results = graph_->drain();
  metrics_->times().compute += ms_since(t0);
  // The state is the last drained step's: a stop checkpoints that one.
  const int64_t last_done = results.empty() ? 0 : results.back().step + 1;
  bool go_on = true;
  for (size_t i = 0; i < results.size() && go_on; ++i) {
    const GraphStepResult& r = results[i];
    FinishedStep s;
    s.step = r.step;
    s.loss = r.loss;
    s.samples = graph_samples_;
    s.correct = r.correct;
    s.applied = r.applied;
    s.stats = graph_->stats();
    s.lr = r.lr;
    s.nonfinite = "the loss or the gradient (found on the device, after the gradient sync)";
    s.agreed_nonfinite = true;
    s.restored = true;
    go_on = close_step(s, last_done, i + 1 == results.size() ? stop_signal : 0);
  }
  return go_on;
}

Worker::Duties Worker::duties(int64_t round) const {
  const int64_t eval_every = config_.train.eval_every_steps, ck_every = config_.train.checkpoint_every;
  Duties d;
  d.finished = round == total_steps_;
  d.evaluate = round > 0 && ((eval_every > 0 ? round % eval_every == 0 : round % steps_per_epoch_ == 0) || d.finished);
  d.checkpoint = (round > 0 && ck_every > 0 && round % ck_every == 0) || d.finished;
  d.stop_after = round > 0 && round == options_.stop_after;
  return d;
}

bool Worker::round_duties(int64_t done, const StepPosition& at, int stop_signal) {
  const Duties due = duties(at.round);
  const bool finished = due.finished;
  const int64_t round = at.round, epoch = (at.global - 1) / steps_per_epoch_;
  if (due.evaluate) evaluate(round, epoch);
  if (due.checkpoint || stop_signal) checkpoint(round, done, finished || stop_signal);
  summary_.steps = done;
  if (stop_signal && !finished) {
    end_comm_log();
    say("stopped by " + std::string(signal_name(stop_signal)) + " after step " + str(done) + " of " +
        str(total_steps_) + "; checkpoint " + keeper_.last() + "; continue with the same command and --resume latest");
    summary_.stop_signal = stop_signal;
    stopped_early_ = true;
    return false;
  }
  if (due.stop_after) {
    end_comm_log();
    say("stopping after step " + str(round) + " (--stop-after)");
    stopped_early_ = true;
    return false;
  }
  return !finished;
}

void Worker::evaluate(int64_t round, int64_t epoch) {
  // Its batches have other shapes: the buffers a recorded step baked in may move.
  if (graph_) graph_->invalidate();
  const auto t0 = Clock::now();
  nlohmann::json r = task_.evaluate(training_);
  if (r.contains("accuracy")) {
    summary_.final_accuracy = r["accuracy"].get<double>();
    summary_.best_accuracy = std::max(summary_.best_accuracy, summary_.final_accuracy);
  }
  last_eval_ = r;
  if (!lead_) return;
  r["step"] = round;
  r["epoch"] = epoch;
  r["time_s"] = ms_since(frame_.run_start) / 1e3;
  writer_->write(r);
  char line[64];
  std::snprintf(line, sizeof line, " (%.1fs)", ms_since(t0) / 1e3);
  progress_.line("eval  step " + str(round) + " epoch " + str(epoch) + ": " + task_.describe_eval(r) + line);
}

void Worker::checkpoint(int64_t round, int64_t done, bool must_succeed) {
  TrainingState state;
  state.step = round;
  state.epoch = done / steps_per_epoch_;  // this rank's loader position: its own steps
  state.batch_in_epoch = done % steps_per_epoch_;
  state.global_batch = config_.data.global_batch;
  if (divergence_ && std::isfinite(divergence_->watch().reference())) {
    state.divergence_reference = divergence_->watch().reference();
    state.divergence_reference_end = divergence_->watch().reference_end();
  }
  if (divergence_) state.divergence_start = divergence_->watch().start();
  std::ostringstream opt_state, sync_state;
  e_.optimizer->save(opt_state);
  e_.sync->save(sync_state);
  state.optimizer_state = opt_state.str();
  state.sync_state = sync_state.str();
  const std::string failed = keeper_.save(state, must_succeed);
  if (!failed.empty()) say("warning: " + failed + "; training continues");
}

void Worker::stop_diverged(const std::string& what, int64_t done, bool write) {
  std::string written;
  if (write) {
    checkpoint(done, done, false);
    const std::string path = output_dir(config_) + "/checkpoints/step_" + str(done);
    if (keeper_.last() == path) written = path;
  }
  const std::string line =
      what + "; " +
      divergence_->stop_note(written, write ? "it failed: see the warning above" : "the state no longer gives finite values");
  if (lead_) {
    nlohmann::json r = divergence_->record();
    r["step"] = done;
    r["diverged"] = true;
    r["time_s"] = ms_since(frame_.run_start) / 1e3;
    r["checkpoint"] = written.empty() ? nlohmann::json(nullptr) : nlohmann::json(written);
    r["message"] = line;
    writer_->write(r);
  }
  throw AgreedError(line, kExitDiverged);
}

RunSummary Worker::finish() {
  if (lead_) progress_.finish();
  end_comm_log();
  const int trainers = training_.size();
  const std::string out = output_dir(config_);
  summary_.steps = total_steps_;
  summary_.seconds = ms_since(frame_.run_start) / 1e3;
  summary_.samples_per_s = static_cast<double>(total_steps_ - frame_.first_step) * global_batch(config_, trainers) /
                           std::max(ms_since(frame_.train_start) / 1e3, 1e-9);
  std::string summary_json;
  const std::string table = comm::comm_summary(world_, &summary_json);
  if (!lead_) return summary_;
  std::string result = last_eval_.is_null() ? "no evaluation" : "final " + task_.describe_eval(last_eval_);
  char line[256];
  if (last_eval_.contains("accuracy")) {
    std::snprintf(line, sizeof line, "; best accuracy %.2f%%", 100 * summary_.best_accuracy);
    result += line;
  }
  std::snprintf(line, sizeof line, "done: %lld steps in %s (%.1f samples/s); ", static_cast<long long>(summary_.steps),
                format_duration(summary_.seconds).c_str(), summary_.samples_per_s);
  progress_.line(line + result);
  if (world_.size() > 1) progress_.line("communication (all ranks):\n" + table);
  if (config_.comm.log) {
    comm::write_comm_summary(table, out + "/comm/summary.txt");
    comm::write_comm_summary(summary_json, out + "/comm/summary.json");
  }
  nlohmann::json record{{"steps", summary_.steps},
                        {"world_size", world_.size()},
                        {"seconds", summary_.seconds},
                        {"samples_per_s", summary_.samples_per_s},
                        {"final_eval", last_eval_}};
  if (last_eval_.contains("accuracy")) {
    record["final_accuracy"] = summary_.final_accuracy;
    record["best_accuracy"] = summary_.best_accuracy;
  }
  std::ofstream(out + "/summary.json") << record.dump(2) << "\n";
  return summary_;
}

}  // namespace

RunSummary run_worker(const Config& config, const RunOptions& options, comm::Communicator& world,
                      comm::Communicator& training, int threads, Clock::time_point run_start) {
  Worker worker(config, options, world, training, threads, run_start);
  return worker.run();
}

}  // namespace trainer::app
