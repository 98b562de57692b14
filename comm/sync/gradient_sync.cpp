#include "comm/sync/gradient_sync.h"

#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/wrappers/host_staged.h"
#include "comm/sync/wrappers/keep_dense.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {
namespace {

// The dense warmup of docs/architecture.md section 4, as a decorator around any method: the first
// `warmup_steps` steps are dense allreduce; from then on the method runs (compression starts from
// zero residuals: the method has not seen a gradient before its first step).
class WarmupSync final : public GradientSync {
 public:
  WarmupSync(std::unique_ptr<GradientSync> method, Communicator& comm, int64_t n, double bucket_mb,
             int64_t warmup_steps, models::Backend& backend, WireDType wire, const DenseBuckets& buckets)
      : method_(std::move(method)), dense_(comm, n, bucket_mb, backend, wire, buckets), warmup_steps_(warmup_steps) {}
  std::string name() const override { return method_->name(); }
  std::string describe() const override {
    return "first " + std::to_string(warmup_steps_) + " steps: " + dense_.describe() + "\nthen " + method_->describe();
  }
  Phase phase(int64_t step) const override { return step < warmup_steps_ ? Phase::kDense : method_->phase(step); }
  WireVolume wire_volume() const override { return method_->wire_volume(); }
  bool begin_step(SyncBuffers& b, int64_t step) override {
    early_ = step < warmup_steps_ ? static_cast<GradientSync*>(&dense_) : method_.get();
    return early_->begin_step(b, step);
  }
  void gradients_ready(int64_t from) override { early_->gradients_ready(from); }
  int finish_early_sends() override { return early_->finish_early_sends(); }
  SyncStats reduce(SyncBuffers& b, int64_t step) override {
    if (step >= warmup_steps_) return method_->reduce(b, step);
    const SyncStats stats = dense_.reduce(b, step);
    method_->dense_warmup_step(b);
    return stats;
  }
  void after_step(SyncBuffers& b, int64_t step) override {
    if (step >= warmup_steps_) method_->after_step(b, step);
  }
  void complete_in_flight() override { method_->complete_in_flight(); }
  std::string overlap_plan() const override {
    return "the first " + std::to_string(warmup_steps_) + " steps: " + dense_.overlap_plan() + "; then " +
           method_->overlap_plan();
  }
  void save(std::ostream& out) const override { method_->save(out); }
  void load(std::istream& in) override { method_->load(in); }
  std::string load_resharded(const std::vector<std::string>& states) override {
    return method_->load_resharded(states);
  }

 private:
  std::unique_ptr<GradientSync> method_;
  DenseSync dense_;
  int64_t warmup_steps_;
  GradientSync* early_ = &dense_;  // the step's own method, which begin_step asked
};

}  // namespace

std::string GradientSync::load_resharded(const std::vector<std::string>&) {
  throw std::runtime_error("sync.method '" + name() + "' cannot resume on another number of processes yet " +
                           "(resume with the number that wrote the checkpoint)");
}

std::string GradientSync::load_replicated(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error(name() + ": no saved state to resume from");
  std::stringstream before;
  save(before);
  std::string first;
  try {
    for (size_t r = 0; r < states.size(); ++r) {
      std::istringstream in(states[r]);
      load(in);
      std::ostringstream back;
      save(back);
      if (r == 0) first = back.str();
      if (back.str() != first)
        throw std::runtime_error(name() + " state of saved rank " + std::to_string(r) +
                                 " differs from rank 0's, though the method keeps it equal on every rank");
    }
    std::istringstream in(states[0]);
    load(in);
  } catch (...) {
    load(before);
    throw;
  }
  return name() + " state: the same on the " + std::to_string(states.size()) + " saved ranks, kept";
}

std::unique_ptr<GradientSync> make_gradient_sync(const SyncOptions& o, Communicator& comm, int64_t n,
                                                 const std::vector<models::ParamView>* views) {
  const SyncMethod& spec = sync_method(o.method);
  models::Backend& device = o.backend ? *o.backend : models::cpu_backend();
  // A method that computes on host buffers, on a run whose buffers are a device's: built for the
  // host (the CPU backend, and the host side of `comm`) and run on host copies (host_staged.h).
  const bool staged = !device.is_host() && !takes_device_buffers(spec, o);
  models::Backend& backend = staged ? models::cpu_backend() : device;
  Communicator& method_comm = staged ? comm.host_side() : comm;
  if (spec.check)
    for (const SyncOptionProblem& problem : spec.check(o))
      throw std::invalid_argument("[sync." + o.method + "] " + problem.message);
  // sync.<method>.keep_dense (keep_dense.h): the tensors it names, per view; empty when unset.
  std::vector<bool> kept;
  const std::string keep_dense = spec.can.compresses ? options_of<CompressorOptions>(o).keep_dense : "";
  if (!keep_dense.empty()) {
    if (!views) throw std::invalid_argument(o.key_path("keep_dense") + " needs the model's tensor names");
    kept = match_keep_dense(keep_dense, *views);
  }
  std::unique_ptr<GradientSync> method = spec.make(o, SyncContext{method_comm, n, views, backend, kept});
  if (o.dense_warmup_steps > 0 && spec.can.wrapped_in_warmup)
    method = std::make_unique<WarmupSync>(std::move(method), method_comm, n, o.bucket_mb, o.dense_warmup_steps, backend,
                                          o.wire(), DenseBuckets{o.first_bucket_mb, o.overlap, views});
  // The methods that sync parameters (their spec: keeps_parameters_equal is false) read and write
  // them; the others only the gradient.
  // DGC's weight decay reads them too (its own momentum on lambda p, dgc.h).
  const bool reads_parameters = method_owns_momentum(spec, o) && o.recipe.coupled_weight_decay > 0;
  if (staged)
    return std::make_unique<HostStagedSync>(std::move(method), device,
                                            !spec.can.keeps_parameters_equal || reads_parameters);
  return method;
}

}  // namespace trainer::comm
