#include "trainer/run.h"

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <set>
#include <sstream>
#include <thread>

#include "comm/chrome_trace.h"
#include "comm/comm_log.h"
#include "comm/comm_summary.h"
#include "comm/comm_wait.h"
#include "comm/sync/async_ps.h"
#include "comm/sync/dense.h"
#include "comm/sync/select.h"
#include "optim/clip.h"
#include "trainer/checkpoint.h"
#include "trainer/experiment.h"
#include "trainer/metrics.h"
#include "trainer/preemption.h"
#include "trainer/ps_server.h"
#include "trainer/step_control.h"

namespace trainer::app {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// FNV-1a over the parameter bytes: equal on all ranks iff they start from the same weights.
uint64_t checksum(const float* data, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < n * 4; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// A resumed run continues metrics.jsonl: drop the records a killed run wrote after the checkpoint.
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\":");
    if (pos != std::string::npos && std::atoll(line.c_str() + pos + 7) > step) continue;
    kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

// run.json (rank 0, at every start): what the logs alone do not say and `trainer report` needs for
// the theoretical volumes of the sync method (n, P, k, dense buckets, the parameter shapes).
void write_run_info(const std::string& path, const Config& config, const models::ParameterStore& params, int world,
                    int64_t total_steps, int64_t steps_per_epoch, int64_t first_step) {
  const int64_t n = params.size();
  const int64_t bucket = comm::bucket_elements(config.sync.bucket_mb);
  nlohmann::json views = nlohmann::json::array();
  for (const models::ParamView& v : params.views()) views.push_back({{"name", v.name}, {"shape", v.shape}});
  const nlohmann::json info{{"world_size", world},
                            {"arch", config.model.arch},
                            {"method", config.sync.method},
                            {"n", n},
                            {"density", config.sync.density},
                            {"k", comm::top_k_count(config.sync.density, n)},
                            {"dense_warmup_steps", config.sync.dense_warmup_steps},
                            {"bucket_elements", bucket},
                            {"dense_buckets", (n + bucket - 1) / bucket},
                            {"batch_size", config.data.batch_size},
                            {"total_steps", total_steps},
                            {"steps_per_epoch", steps_per_epoch},
                            {"first_step", first_step},
                            {"parameters", views}};
  std::ofstream f(path);
  f << info.dump(1) << "\n";
  if (!f) throw std::runtime_error(path + ": write failed");
}

// Test hook: TRAINER_TEST_INJECT_NAN="RANK:STEP[,RANK:STEP]..." puts a NaN into the local gradient
// of the last parameter tensor on that rank after that step's backward pass.
std::set<std::pair<int, int64_t>> nan_injections() {
  std::set<std::pair<int, int64_t>> at;
  const char* env = std::getenv("TRAINER_TEST_INJECT_NAN");
  if (!env) return at;
  std::istringstream in(env);
  std::string item;
  while (std::getline(in, item, ',')) {
    int rank = -1;
    long long step = -1;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%d:%lld%c", &rank, &step, &extra) != 2 || rank < 0 || step < 0)
      throw std::runtime_error("TRAINER_TEST_INJECT_NAN: expected RANK:STEP[,RANK:STEP]..., got '" +
                               std::string(env) + "'");
    at.insert({rank, step});
  }
  return at;
}

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

// After training (also after --stop-after), on every rank of the world: waits from the ranks' entry
// times, then the trace.
void finish_comm_log(const Config& config, comm::Communicator& comm, const std::vector<comm::TraceSpan>& spans,
                     const std::string& out) {
  comm.log().flush();
  comm::resolve_waits(comm);
  if (config.comm.trace_steps > 0) comm::write_chrome_trace(comm, spans, out + "/trace.json");
}

// The straggler knob (runtime.slowdown): this rank sleeps (factor - 1) times the step's own work.
void slow_down(const Config& config, int rank, double step_ms) {
  if (rank != config.runtime.slowdown_rank || config.runtime.slowdown_factor <= 1) return;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>((config.runtime.slowdown_factor - 1) * step_ms));
}

}  // namespace

void check_identical(const models::ParameterStore& params, comm::Communicator& comm) {
  if (comm.size() == 1) return;
  const std::vector<float> host = params.host_values();  // the weights may live on a GPU
  const auto h = static_cast<int64_t>(checksum(host.data(), params.size()) >> 1);
  int64_t lo = h, hi = h;
  comm.allreduce(&lo, 1, comm::DType::kI64, comm::ReduceOp::kMin, "ALLREDUCE_CHECK");
  comm.allreduce(&hi, 1, comm::DType::kI64, comm::ReduceOp::kMax, "ALLREDUCE_CHECK");
  if (lo != hi) throw std::runtime_error("ranks hold different initial weights (parameter checksums differ)");
}

void print_dry_run(const Config& config, comm::Communicator& comm) {
  if (comm.rank() != 0) return;
  std::printf("%s\n", to_toml(config).c_str());
  std::vector<models::ParamView> views;
  const int64_t n = model_parameter_count(config, &views);
  const size_t tensors = views.size();
  std::printf("device: %s\n", device_backend(config, comm.local_rank()).describe().c_str());
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
  std::printf("output: %s\n", output_dir(config).c_str());
}

RunSummary run_training(const Config& config, const RunOptions& options, comm::Communicator& comm) {
  const auto t_start = Clock::now();
  const int rank = comm.rank(), world = comm.size();
  const bool lead = rank == 0;
  // Under mpiexec a rank's stdout is a pseudo-terminal even when the job's output goes to a file,
  // so the live line is only used by a process started directly from a terminal.
  Progress progress(lead && world == 1 && Progress::stdout_is_terminal());
  auto say = [&](const std::string& text) {
    if (lead) progress.line(text);
  };
  // async_ps: the last sync.servers ranks are parameter servers (a bad count is the same error on
  // every rank).
  comm::PsLayout layout;
  if (config.sync.method == "async_ps") {
    try {
      layout = comm::PsLayout::make(world, config.sync.servers);
    } catch (const std::invalid_argument& e) {
      throw AgreedError(e.what(), 1);
    }
  }
  install_stop_handlers();
  const auto inject_nan = nan_injections();
  const int threads = configure_runtime(config, comm.local_size());
  const std::string out = output_dir(config);
  if (lead) {
    fs::create_directories(out + "/comm");
    std::ofstream f(out + "/config.toml");
    f << to_toml(config);
    if (!f) throw std::runtime_error(out + "/config.toml: write failed");
  }
  comm.barrier("BARRIER_SETUP");
  comm::CommLogOptions log_options;
  log_options.enabled = config.comm.log;
  log_options.path = out + "/comm/rank" + std::to_string(rank) + ".jsonl";
  log_options.first_step = config.comm.log_first_step;
  log_options.last_step = config.comm.log_last_step;
  log_options.every = config.comm.log_every;
  log_options.append = !options.resume.empty();  // a resumed run continues its records
  log_options.trace_first_step = config.comm.trace_first_step;
  log_options.trace_last_step = config.comm.trace_first_step + config.comm.trace_steps - 1;
  comm.log().open(log_options, rank, world);
  comm::align_log_clock(comm);  // first clock sample for the wait split and the trace

  // A rank's role decides its step. async_ps servers serve (trainer/ps_server.h) and take part in
  // the world's collectives below (checkpoints, the comm log) in the same order as the workers; the
  // workers' own collectives (evaluation) run on `training`, their communicator.
  std::unique_ptr<comm::Communicator> workers;
  if (layout.world > 0) {
    workers = comm.split(layout.is_server(rank) ? -1 : 0, rank);
    if (!workers) {
      const bool finished = run_server(config, options, comm);
      finish_comm_log(config, comm, {}, out);
      if (finished) comm::comm_summary(comm);
      return RunSummary{};
    }
  }
  comm::Communicator& training = workers ? *workers : comm;
  const int trainers = training.size();
  const bool lockstep = !workers;  // every rank takes every step together (the per-step control allreduce)

  Experiment e = build_experiment(config, comm, training, say);
  Task& task = *e.task;
  models::ParameterStore& params = task.parameters();
  models::ParameterStore& buffers = task.buffers();
  comm::SyncBuffers sync_buffers{params.values(), params.grads(), params.size(), buffers.values(), buffers.size(),
                                 &params.views()};
  const DataConfig& d = config.data;
  const int64_t steps_per_epoch = task.steps_per_epoch();
  const int64_t total_steps = app::total_steps(config, steps_per_epoch);

  const CheckpointIdentity identity{world, rank, config_hash(config), config.model.arch};
  int64_t first_step = 0;   // the global step the run starts from
  int64_t first_clock = 0;  // the steps this rank had taken then: its loader position (async_ps workers
                            // take different numbers of steps; every other method's ranks take first_step)
  std::string last_checkpoint;  // the newest complete one, for messages
  if (!options.resume.empty()) {
    LoadedCheckpoint ck = load_checkpoint(out, options.resume, identity, params, buffers, comm);
    if (!ck.warning.empty()) say("warning: " + ck.warning);
    std::istringstream opt_state(ck.state.optimizer_state), sync_state(ck.state.sync_state);
    e.optimizer->load(opt_state);
    e.sync->load(sync_state);
    first_step = ck.state.step;
    first_clock = ck.state.epoch * steps_per_epoch + ck.state.batch_in_epoch;
    last_checkpoint = ck.path;
    task.seek(ck.state.epoch, ck.state.batch_in_epoch);
    if (lead) truncate_metrics(out + "/metrics.jsonl", first_step);
    say(fmt("resumed from %s at step %lld", ck.path.c_str(), static_cast<long long>(first_step)));
  } else {
    check_identical(params, comm);
    if (lead) std::ofstream(out + "/metrics.jsonl", std::ios::trunc);
  }
  std::unique_ptr<MetricsWriter> metrics;
  if (lead) {
    metrics = std::make_unique<MetricsWriter>(out + "/metrics.jsonl");
    write_run_info(out + "/run.json", config, params, world, total_steps, steps_per_epoch, first_step);
  }

  say(fmt("trainer: %s: %s (%lld parameters) on %lld training examples, steps %lld..%lld of batch %lld x %d processes, "
          "%d threads each, sync %s; output in %s",
          config.experiment.name.c_str(), config.model.arch.c_str(), static_cast<long long>(params.size()),
          static_cast<long long>(task.train_examples()), static_cast<long long>(first_step),
          static_cast<long long>(total_steps), static_cast<long long>(d.batch_size), trainers, threads,
          config.sync.method.c_str(), out.c_str()));

  // A checkpoint at global step `step`, taken when this rank has taken `clock` steps.
  auto save = [&](int64_t step, int64_t clock) {
    TrainingState state;
    state.step = step;
    state.epoch = clock / steps_per_epoch;
    state.batch_in_epoch = clock % steps_per_epoch;
    std::ostringstream opt_state, sync_state;
    e.optimizer->save(opt_state);
    e.sync->save(sync_state);
    state.optimizer_state = opt_state.str();
    state.sync_state = sync_state.str();
    save_checkpoint(out, identity, params, buffers, state, comm, static_cast<int>(config.train.keep_checkpoints));
    last_checkpoint = out + "/checkpoints/step_" + std::to_string(step);
  };
  auto last_checkpoint_note = [&] {
    return last_checkpoint.empty() ? std::string("no checkpoint has been written yet")
                                   : "the last complete checkpoint is " + last_checkpoint;
  };
  // A failed periodic checkpoint (full disk, I/O error, read-only folder: every rank throws the
  // same line) is a warning: training goes on and the previous complete checkpoint stays the one
  // "--resume latest" finds. The final one, or the one a stop signal asks for, is an error.
  auto save_or_warn = [&](int64_t step, int64_t clock, bool must_succeed) {
    try {
      save(step, clock);
    } catch (const std::runtime_error& err) {
      const std::string what = fmt("checkpoint at step %lld failed: %s; ", static_cast<long long>(step), err.what()) +
                               last_checkpoint_note();
      if (must_succeed) throw AgreedError(what, 1);
      say("warning: " + what + "; training continues");
    }
  };

  RunSummary summary;
  double best = 0;
  nlohmann::json last_eval;
  auto run_eval = [&](int64_t step, int64_t epoch) {
    const auto t0 = Clock::now();
    nlohmann::json r = task.evaluate(training);
    if (r.contains("accuracy")) {
      summary.final_accuracy = r["accuracy"].get<double>();
      best = std::max(best, summary.final_accuracy);
    }
    last_eval = r;
    if (!lead) return;
    r["step"] = step;
    r["epoch"] = epoch;
    r["time_s"] = ms_since(t_start) / 1e3;
    metrics->write(r);
    progress.line(fmt("eval  step %lld epoch %lld: %s (%.1fs)", static_cast<long long>(step),
                      static_cast<long long>(epoch), task.describe_eval(r).c_str(), ms_since(t0) / 1e3));
  };

  // Interval accumulators, reset at each metrics record.
  double loss_sum = 0, t_data = 0, t_compute = 0, t_sync = 0, t_optim = 0, density_sum = 0, tau_sum = 0;
  int64_t interval_steps = 0, interval_samples = 0, interval_correct = 0, interval_skipped = 0, sent = 0,
          received = 0, tau_max = -1;
  auto interval_start = Clock::now();
  int64_t interval_first_global = first_step;
  const auto train_start = Clock::now();
  comm::Phase phase = comm::Phase::kDense;
  // The Chrome trace's compute phases (comm/chrome_trace.h), on the comm log's clock.
  std::vector<comm::TraceSpan> spans;
  const int64_t trace_end = config.comm.trace_first_step + config.comm.trace_steps;
  int64_t span_start = 0;
  auto span = [&](const char* name, int64_t step) {
    if (step < config.comm.trace_first_step || step >= trace_end) return;
    const int64_t now = comm.log().now_us();
    spans.push_back(comm::TraceSpan{name, step, span_start, now});
    span_start = now;
  };

  // Non-finite steps skipped in a row (train.skip_nonfinite_steps), and the BN statistics before
  // the step's forward pass, restored when it is skipped (only kept when skipping is enabled).
  int64_t skipped_in_a_row = 0;
  std::vector<float> buffers_before;
  auto nonfinite = [&](int64_t step, const std::string& what) {
    ++skipped_in_a_row;
    const std::string where = fmt("non-finite value at step %lld: %s", static_cast<long long>(step), what.c_str());
    if (skipped_in_a_row > config.train.skip_nonfinite_steps) {
      const std::string limit =
          config.train.skip_nonfinite_steps == 0
              ? std::string("set train.skip_nonfinite_steps to skip such steps, or lower optim.lr / set "
                            "optim.grad_clip_norm")
              : fmt("more than train.skip_nonfinite_steps = %lld steps in a row",
                    static_cast<long long>(config.train.skip_nonfinite_steps));
      throw AgreedError(where + " (" + limit + "); " + last_checkpoint_note(), kExitNonFinite);
    }
    buffers.copy_values_from_host(buffers_before.data(), buffers_before.size() * sizeof(float));
    say(fmt("warning: %s; step skipped on every rank (%lld in a row)", where.c_str(),
            static_cast<long long>(skipped_in_a_row)));
  };

  if (config.train.eval_at_start && first_step == 0) run_eval(0, 0);
  // `step` counts this rank's steps; the run's progress is counted in global steps (the same
  // thing except for async_ps workers, whose servers count pushes / W).
  bool finished = first_step >= total_steps;
  for (int64_t step = first_clock; !finished; ++step) {
    auto t0 = Clock::now();
    const auto step_t0 = t0;
    const int64_t step_start = span_start = comm.log().now_us();
    task.load_batch();
    t_data += ms_since(t0);
    span("data", step);

    if (rank == options.fail_rank && step == options.fail_step)
      throw std::runtime_error(fmt("injected failure at step %lld (--inject-failure)", static_cast<long long>(step)));
    t0 = Clock::now();
    if (config.train.skip_nonfinite_steps > 0) buffers_before = buffers.host_values();  // on the host: the device's may be a GPU's
    const StepResult result = task.forward_backward();
    const double loss = result.loss;
    if (inject_nan.count({rank, step})) e.backend->fill(1, std::nanf(""), params.grads() + params.views().back().offset);
    t_compute += ms_since(t0);
    span("forward_backward", step);
    slow_down(config, rank, ms_since(step_t0));

    // The control allreduce: a stop signal on any rank, and a NaN or infinity in any rank's loss or
    // local gradient, found before the sync can spread it into other ranks' weights or residuals.
    t0 = Clock::now();
    comm.log().set_step(step, config.sync.method == "dense" || step < config.sync.dense_warmup_steps
                                  ? comm::Phase::kDense
                                  : comm::Phase::kCompressed);
    // Without lockstep (async_ps workers) each rank checks its own: a non-finite gradient, or a stop
    // signal (no checkpoint the servers would join), ends the job on every rank (MPI_Abort).
    const StepVerdict verdict = lockstep ? agree_on_step(comm, stop_signal_received(), loss, *e.backend, params)
                                         : check_step_here(rank, stop_signal_received(), loss, *e.backend, params);
    t_sync += ms_since(t0);
    if (!lockstep && (verdict.nonfinite || verdict.stop_signal))
      throw std::runtime_error(verdict.nonfinite ? fmt("non-finite value at step %lld: %s", static_cast<long long>(step),
                                                       nonfinite_item(verdict.tensor, params).c_str())
                                                 : std::string("stopped by a signal: async_ps continues from the last "
                                                               "periodic checkpoint (train.checkpoint_every)"));
    // A skipped step (train.skip_nonfinite_steps) changes nothing but the loader position on every
    // rank alike: no optimizer step, no local-SGD averaging, BN statistics restored, and no sync when
    // the control allreduce found it (after the sync only an overflow of finite local gradients
    // can be found, which leaves finite residuals).
    bool applied = false;
    comm::SyncStats stats;
    const double lr = optim::learning_rate(e.schedule, step, steps_per_epoch, total_steps);
    if (e.sync->applies_update()) {
      // async_ps: this rank's gradient, clipped by its own norm, goes to the servers, which run the
      // optimizer and the lr schedule and send the parameters back.
      optim::clip_grad_norm(*e.backend, params.grads(), params.size(), config.optim.grad_clip_norm);
      t0 = Clock::now();
      stats = e.sync->reduce(sync_buffers, step);
      t_sync += ms_since(t0);
      span("sync", step);
      applied = true;
    } else if (verdict.nonfinite) {
      nonfinite(step, fmt("%s on rank %d, before the gradient sync", nonfinite_item(verdict.tensor, params).c_str(),
                          verdict.rank));
    } else {
      t0 = Clock::now();
      stats = e.sync->reduce(sync_buffers, step);
      t_sync += ms_since(t0);
      span("sync", step);

      // Finite local gradients can still sum to an infinity. The synced gradient is the same on
      // every rank, so every rank decides alike without another message; the norm pass is the one
      // clipping needs anyway.
      t0 = Clock::now();
      const double norm =
          optim::clip_grad_norm(*e.backend, params.grads(), params.size(), config.optim.grad_clip_norm);
      if (!std::isfinite(norm)) {
        nonfinite(step, nonfinite_item(first_nonfinite_gradient(*e.backend, params), params) + " after the gradient sync");
      } else {
        applied = true;
        skipped_in_a_row = 0;
        e.optimizer->step(params.values(), params.grads(), lr);
        t_optim += ms_since(t0);
        span("optimizer", step);
        t0 = Clock::now();
        e.sync->after_step(sync_buffers, step);
        t_sync += ms_since(t0);
        span("after_step", step);
      }
    }
    span_start = step_start;
    span("step", step);
    release_free_heap();

    int64_t step_sent = 0, step_received = 0;
    comm.log().take_totals(step_sent, step_received);
    sent += step_sent;
    received += step_received;
    if (applied) {
      phase = stats.phase;
      density_sum += stats.density;
      loss_sum += loss;
      interval_steps += 1;
      interval_samples += result.samples;
      interval_correct += result.correct;
      if (stats.staleness >= 0) {
        tau_sum += static_cast<double>(stats.staleness);
        tau_max = std::max(tau_max, stats.staleness);
      }
    } else {
      interval_skipped += 1;
    }
    const int64_t done = step + 1;
    // The global step, and the round (evaluation, checkpoint, end) this step completes: this rank's
    // own count where every rank takes every step together; async_ps's servers announce both (a
    // round only at a meet, trainer/ps_server.h; -1 otherwise).
    const int64_t global = lockstep ? done : stats.global_step;
    const int64_t round = lockstep ? done : stats.round;
    const int64_t epoch = (global - 1) / steps_per_epoch;
    finished = round == total_steps;
    const bool log_now = done % config.train.log_every_steps == 0 || finished;
    if (lead) {
      // async_ps: the workers' pace differs, so the job's rate is the servers' (global steps x W batches).
      const double samples = lockstep ? static_cast<double>(interval_samples) * trainers
                                      : static_cast<double>(global - interval_first_global) * trainers * d.batch_size;
      const double rate = samples / std::max(ms_since(interval_start) / 1e3, 1e-9);
      const double shown_lr = stats.lr >= 0 ? stats.lr : lr;  // async_ps: the servers' lr
      const double elapsed = ms_since(train_start) / 1e3;
      const double busy = t_data + t_compute + t_sync + t_optim;
      progress.step(fmt("step %lld/%lld  epoch %lld  loss %.4f  lr %.4g  %.0f samples/s  sync %.0f%%  ETA %s",
                        static_cast<long long>(global), static_cast<long long>(total_steps),
                        static_cast<long long>(epoch), loss_sum / std::max<int64_t>(interval_steps, 1), shown_lr, rate,
                        busy > 0 ? 100 * t_sync / busy : 0.0,
                        format_duration(elapsed / std::max<int64_t>(global - first_step, 1) *
                                        static_cast<double>(total_steps - global))
                            .c_str()),
                    log_now);
      if (log_now) {
        const double k = 1.0 / std::max<int64_t>(interval_steps, 1);
        nlohmann::json record{{"step", global},
                        {"epoch", epoch},
                        {"time_s", ms_since(t_start) / 1e3},
                        {"loss", loss_sum * k},
                        {"lr", lr},
                        {"samples_per_s", rate},
                        {"t_data_ms", t_data * k},
                        {"t_compute_ms", t_compute * k},
                        {"t_sync_ms", t_sync * k},
                        {"t_optim_ms", t_optim * k},
                        {"bytes_sent", static_cast<double>(sent) * k},
                        {"bytes_recv", static_cast<double>(received) * k},
                        {"density", density_sum * k},
                        {"phase", comm::phase_name(phase)}};
        if (task.classifies())
          record["train_accuracy"] = static_cast<double>(interval_correct) / std::max<int64_t>(interval_samples, 1);
        if (interval_skipped > 0) record["skipped_steps"] = interval_skipped;
        if (tau_max >= 0) {  // async_ps: rank 0's gradients' staleness at the servers, and their lr
          record["staleness_mean"] = tau_sum * k;
          record["staleness_max"] = tau_max;
          record["lr"] = stats.lr;
        }
        metrics->write(record);
      }
    }
    if (log_now) {
      loss_sum = t_data = t_compute = t_sync = t_optim = density_sum = tau_sum = 0;
      interval_steps = interval_samples = interval_correct = interval_skipped = sent = received = 0;
      tau_max = -1;
      interval_start = Clock::now();
      interval_first_global = global;
    }
    const int64_t every = config.train.eval_every_steps;
    const bool epoch_end = round % steps_per_epoch == 0;
    if (round > 0 && ((every > 0 && round % every == 0) || (every == 0 && epoch_end) || finished))
      run_eval(round, epoch);
    const int64_t ck_every = config.train.checkpoint_every;
    if ((round > 0 && ck_every > 0 && round % ck_every == 0) || finished || verdict.stop_signal)
      save_or_warn(round, done, finished || verdict.stop_signal);
    if (verdict.stop_signal && !finished) {
      finish_comm_log(config, comm, spans, out);
      say(fmt("stopped by %s after step %lld of %lld; checkpoint %s; continue with the same command and "
              "--resume latest",
              verdict.stop_signal == SIGTERM ? "SIGTERM" : verdict.stop_signal == SIGINT ? "SIGINT" : "a signal",
              static_cast<long long>(done), static_cast<long long>(total_steps), last_checkpoint.c_str()));
      summary.steps = done;
      summary.stop_signal = verdict.stop_signal;
      return summary;
    }
    if (round > 0 && round == options.stop_after) {
      finish_comm_log(config, comm, spans, out);
      if (lead) progress.line(fmt("stopping after step %lld (--stop-after)", static_cast<long long>(round)));
      return summary;
    }
  }
  if (lead) progress.finish();
  finish_comm_log(config, comm, spans, out);

  summary.steps = total_steps;
  summary.best_accuracy = best;
  summary.seconds = ms_since(t_start) / 1e3;
  summary.samples_per_s =
      (total_steps - first_step) * d.batch_size * trainers / std::max(ms_since(train_start) / 1e3, 1e-9);
  std::string summary_json;
  const std::string table = comm::comm_summary(comm, &summary_json);
  if (lead) {
    std::string result = last_eval.is_null() ? "no evaluation" : "final " + task.describe_eval(last_eval);
    if (last_eval.contains("accuracy")) result += fmt("; best accuracy %.2f%%", 100 * summary.best_accuracy);
    progress.line(fmt("done: %lld steps in %s (%.1f samples/s); %s", static_cast<long long>(summary.steps),
                      format_duration(summary.seconds).c_str(), summary.samples_per_s, result.c_str()));
    if (world > 1) progress.line("communication (all ranks):\n" + table);
    if (config.comm.log) {
      comm::write_comm_summary(table, out + "/comm/summary.txt");
      comm::write_comm_summary(summary_json, out + "/comm/summary.json");
    }
    nlohmann::json record{{"steps", summary.steps},
                          {"world_size", world},
                          {"seconds", summary.seconds},
                          {"samples_per_s", summary.samples_per_s},
                          {"final_eval", last_eval}};
    if (last_eval.contains("accuracy")) {
      record["final_accuracy"] = summary.final_accuracy;
      record["best_accuracy"] = summary.best_accuracy;
    }
    std::ofstream(out + "/summary.json") << record.dump(2) << "\n";
  }
  return summary;
}

}  // namespace trainer::app
