// The gradient-sync stage: the only place a training step talks to the network (docs/architecture.md
// sections 2 and 4). A method is one class behind this small interface, chosen by
// `[sync] method` from the method table (registry.h) and built by make_gradient_sync(); what it can
// do (device buffers, compression, where the update runs) is its spec's; it owns its state (thresholds, region bounds,
// PowerSGD factors, counters; the compressing methods' error-feedback residual through
// ErrorFeedbackSync, error_feedback_sync.h) and saves and restores it for exact resume.
//
// Per step the trainer calls, in order:
//   begin_step(step)     before the forward pass; a method that overlaps its messages with
//                        backward (dense buckets, every method's dense warmup) returns true, and
//   gradients_ready(from)  is then called during backward whenever gradient entries [from, n) are
//                        final, and
//   finish_early_sends() right after backward waits for what went out early
//   reduce(grads)        after backward: on return grads holds what the optimizer must apply
//                        (the average over ranks for synchronous methods; the local gradient for
//                        local SGD between averaging steps)
//   optimizer step
//   after_step(params)   after the optimizer: local SGD averages parameters here
// and, once, before the comm log is finished (the run's end, a stop), complete_in_flight(): a method
// that keeps a transfer running across steps (diloco's delayed fragment) waits for it there, so no
// call is left running and every call is in the log. save() waits for such a transfer too.
// except for a method whose spec says applies_update (async_ps, registry.h): its reduce() sends the gradient
// to where the optimizer runs (the parameter servers) and returns with the new parameters, and the
// trainer runs no optimizer step of its own.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"
#include "comm/sync/sync_settings.h"
#include "comm/wire_format.h"
#include "models/backend.h"
#include "models/parameters.h"

namespace trainer::comm {

// What a step's sync did, for metrics.jsonl.
struct SyncStats {
  Phase phase = Phase::kDense;
  double density = 1.0;  // fraction of gradient entries this rank contributed
  int64_t staleness = -1;  // async_ps: tau of this step's gradient at the servers (-1: synchronous method)
  double lr = -1;          // async_ps: the lr the servers applied (-1: the trainer's own schedule)
  int64_t global_step = -1;  // async_ps: the servers' step (pushes / W, rounded up)
  int64_t round = -1;        // async_ps: the meet (global step) this reply completes, -1 for none
  // sync.<method>.adaptive (accordion.h): the share of the compressed entries sent at the low-compression
  // setting this step (1: all of them, 0: none); -1 when the method does not adapt.
  double low_compression = -1;
  // sync.<method>.density_warmup_*: the density the selection aimed at this step (-1: no warm-up).
  double density_target = -1;
  // A method that reuses an estimate over steps (oktopk's thresholds, recomputed every
  // local_threshold_every and global_threshold_every steps): 1 on a step that computed it afresh, 0 on
  // one that reused it; -1 when the method keeps none. `trainer bench sync` times the two apart.
  int fresh_estimate = -1;
  // A method that selects by threshold: the entries this rank selected and those in the global
  // selection every rank receives (-1: it does not say), against k in `trainer bench sync`.
  int64_t selected_local = -1;
  int64_t selected_global = -1;
};

// The model's flat buffers as the sync stage sees them: memory of SyncOptions::backend (device
// pointers on a GPU).
struct SyncBuffers {
  float* params = nullptr;
  float* grads = nullptr;
  int64_t n = 0;  // elements of params and grads
  float* state = nullptr;  // non-trainable model state (BN running statistics), averaged with params
  int64_t n_state = 0;     // by methods that average parameters
  const std::vector<models::ParamView>* views = nullptr;  // named tensors, for layer-wise methods
};

// What a method sends per rank and step by its own algebra (not measured): words of 4 bytes and the
// formula they come from, for `trainer bench sync` (beside the measured bytes) and --dry-run. A
// method that does not say has words < 0.
struct WireVolume {
  double words = -1;
  std::string formula;  // "2k(P-1)"
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual std::string name() const = 0;
  // One line per fact for --dry-run: what is sent per step and how much.
  virtual std::string describe() const = 0;
  // Its compressed steps' volume (a warmup wrapper answers its method's).
  virtual WireVolume wire_volume() const { return {}; }
  // The phase step `step` is in (the comm log's and the metrics' label): the methods that send the
  // whole gradient every step answer dense, the others compressed; the warmup wrapper answers dense
  // for its steps. The trainer asks before the step's first message.
  virtual Phase phase(int64_t step) const = 0;
  // Overlap with backward (sync.overlap; docs/architecture.md "The step"). A method that starts its
  // messages during backward returns true from begin_step; its reduce() then finishes what is left.
  // finish_early_sends() returns the first parameter tensor whose local gradient was not finite
  // when it went out (-1: all finite), for the step's verdict, which comes after it.
  virtual bool begin_step(SyncBuffers& b, int64_t step) { return false; }
  virtual void gradients_ready(int64_t from) {}
  virtual int finish_early_sends() { return -1; }
  virtual SyncStats reduce(SyncBuffers& b, int64_t step) = 0;
  // A step of the dense warmup (gradient_sync.cpp's wrapper) just averaged b.grads: a method that owns
  // the optimizer's momentum (sync.<method>.dgc, dgc.h) applies it here, so the warmup's steps keep it.
  virtual void dense_warmup_step(SyncBuffers& b) {}
  virtual void after_step(SyncBuffers& b, int64_t step) {}
  virtual void complete_in_flight() {}
  // What sync.overlap does for this method, for --dry-run: which of its messages go out during
  // backward (asked only when sync.overlap is on).
  virtual std::string overlap_plan() const { return "none (" + name() + " starts after backward)"; }
  // Versioned binary state; load() throws std::runtime_error naming what does not match.
  virtual void save(std::ostream& out) const = 0;
  virtual void load(std::istream& in) = 0;
  // Elastic resume (docs/architecture.md section 4, "Elastic resume"): this rank's state from the
  // states the P ranks of a run on another number of ranks saved, in rank order. State the method
  // keeps equal on every rank is checked and taken as it is; a rank's own state (error-feedback
  // residuals, local thresholds) is merged so that what the average update still owes stays the
  // same. Returns what was done, for the line the resumed run prints. All or nothing; throws
  // std::runtime_error naming what does not match. The default refuses: a method resumes on
  // another number of ranks only once it says how.
  virtual std::string load_resharded(const std::vector<std::string>& states);

 protected:
  // load_resharded for a method whose whole state is the same on every rank: each saved state is
  // loaded in turn (load() checks it) and must save back to the same bytes as rank 0's.
  std::string load_replicated(const std::vector<std::string>& states);
};

// The run around a method, beyond its [sync] keys: the optimizer, the run's length and schedule, the
// seed and the task. The trainer builds it once from the config (trainer/config/config_sync.h); the
// method's defaults, start notes, rules and factory all read this one value (SyncOptions::recipe).
struct SyncRecipe {
  // The optimizer's, for a method that owns its momentum or clipping (registry.h: owns_momentum,
  // owns_clipping; sync.<method>.dgc) and for the defaults and notes that depend on it: optim.name,
  // optim.momentum, optim.nesterov, optim.grad_clip_norm, and the weight decay the optimizer adds to
  // the gradient (optim.weight_decay; 0 when none or decoupled): sync.<method>.dgc's checks.
  std::string optimizer = "sgd";
  double momentum = 0;
  bool nesterov = false;
  double grad_clip_norm = 0;
  double coupled_weight_decay = 0;
  uint64_t seed = 0;     // experiment.seed (powersgd: the first Q's seed, the same on every rank)
  bool speech = false;   // a speech task (data.dataset = "an4"): deepspeech or las
  // The run's length, 0 where it is not known yet (the config's load and --dry-run come before the
  // data is read): its steps (async_ps: the servers' schedule and end; the warmup notes), the steps
  // of an epoch (async_ps: the servers' lr schedule; Accordion: an interval of 0) and the steps where
  // the learning rate drops (Accordion: the interval after is critical).
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  std::vector<int64_t> lr_decay_steps;
};

// What make_gradient_sync builds from: the [sync] settings (sync_settings.h: the stage's keys and
// every method's own, which each method reads through its options struct), the recipe around it,
// and where its buffers live.
struct SyncOptions : SyncSettings {
  // Not an aggregate: a braced list of values would fill the settings' fields in declaration order.
  explicit SyncOptions(const SyncSettings& settings = {}, SyncRecipe run = {})
      : SyncSettings(settings), recipe(std::move(run)) {}
  SyncRecipe recipe;
  // Where SyncBuffers live (runtime.device's backend); null: the CPU. The methods whose spec says
  // device_buffers (registry.h; and the dense warmup) run their arithmetic on this backend and
  // their communicator moves its memory (comm/device_communicator.h); the others compute on host
  // copies (host_staged.h).
  models::Backend* backend = nullptr;
};

// Builds the method of the table (registry.h) named o.method, inside the dense warmup when there is
// one. A method without device_buffers in its spec, given a device backend (o.backend), runs on
// host copies of the buffers (host_staged.h): `comm` must then move host memory (MPI). Throws
// std::invalid_argument naming the available methods for an unknown one and naming the key for
// options the method's checks refuse.
// `views` (the model's named tensors) are needed by layer-wise methods (powersgd), which refuse to
// be built without them.
std::unique_ptr<GradientSync> make_gradient_sync(const SyncOptions& options, Communicator& comm, int64_t n,
                                                 const std::vector<models::ParamView>* views = nullptr);

// The names of every method in the method table (registry.h), in its order.
std::vector<std::string> sync_method_names();

}  // namespace trainer::comm
