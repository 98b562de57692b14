#include "comm/sync/gradient_sync.h"

#include <sstream>
#include <stdexcept>

#include "comm/sync/async_ps.h"
#include "comm/sync/dense.h"
#include "comm/sync/diloco.h"
#include "comm/sync/gaussiank.h"
#include "comm/sync/gtopk.h"
#include "comm/sync/keep_dense.h"
#include "comm/sync/local_sgd.h"
#include "comm/sync/oktopk.h"
#include "comm/sync/powersgd.h"
#include "comm/sync/topka.h"
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
  bool begin_step(SyncBuffers& b, int64_t step) override {
    early_ = step < warmup_steps_ ? static_cast<GradientSync*>(&dense_) : method_.get();
    return early_->begin_step(b, step);
  }
  void gradients_ready(int64_t from) override { early_->gradients_ready(from); }
  int finish_early_sends() override { return early_->finish_early_sends(); }
  SyncStats reduce(SyncBuffers& b, int64_t step) override {
    return step < warmup_steps_ ? dense_.reduce(b, step) : method_->reduce(b, step);
  }
  void after_step(SyncBuffers& b, int64_t step) override {
    if (step >= warmup_steps_) method_->after_step(b, step);
  }
  void complete_in_flight() override { method_->complete_in_flight(); }
  void save(std::ostream& out) const override { method_->save(out); }
  void load(std::istream& in) override { method_->load(in); }
  bool keeps_parameters_equal() const override { return method_->keeps_parameters_equal(); }
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
  models::Backend& backend = o.backend ? *o.backend : models::cpu_backend();
  if (backend.name() != models::cpu_backend().name() && !takes_device_buffers(o.method))
    throw std::invalid_argument("sync.method '" + o.method + "' computes on host buffers and cannot run with " +
                                "runtime.device = \"" + backend.name() + "\" yet (dense and local_sgd can)");
  // sync.keep_dense (keep_dense.h): the tensors it names, per view; empty when unset.
  std::vector<bool> kept;
  if (!o.keep_dense.empty()) {
    if (!compresses_gradient(o.method))
      throw std::invalid_argument("sync.keep_dense applies to the compressing methods (oktopk, topka, gaussiank, "
                                  "gtopk, powersgd), not to '" + o.method + "'");
    if (!views) throw std::invalid_argument("sync.keep_dense needs the model's tensor names");
    kept = match_keep_dense(o.keep_dense, *views);
  }
  std::unique_ptr<GradientSync> method;
  if (o.method == "async_ps") return std::make_unique<AsyncPsWorker>(comm, o, n);
  const DenseBuckets buckets{o.first_bucket_mb, o.overlap, views};
  if (o.method == "dense") return std::make_unique<DenseSync>(comm, n, o.bucket_mb, backend, o.wire_dtype, buckets);
  if (o.method == "local_sgd") method = std::make_unique<LocalSgd>(comm, n, o.bucket_mb, o.period, backend);
  if (o.method == "diloco") {
    DilocoOptions d;
    d.period = o.period;
    d.fragments = o.fragments;
    d.delay = o.sync_delay;
    d.mixing = o.mixing;
    d.outer_optimizer = o.outer_optimizer;
    d.outer_lr = o.outer_lr;
    d.outer_momentum = o.outer_momentum;
    d.bucket_elements = bucket_elements(o.bucket_mb);
    d.outer_dtype = o.outer_dtype;
    d.overlap = o.overlap;
    method = std::make_unique<Diloco>(comm, n, views, d);
  }
  auto sparse = [&](int64_t count) -> std::unique_ptr<GradientSync> {
    std::unique_ptr<ErrorFeedbackSync> m;
    if (o.method == "oktopk") m = std::make_unique<OkTopk>(comm, count, o);
    if (o.method == "topka") m = std::make_unique<TopkA>(comm, count, o.density);
    if (o.method == "gaussiank") m = std::make_unique<GaussianK>(comm, count, o.density);
    if (o.method == "gtopk") m = std::make_unique<GTopk>(comm, count, o.density);
    if (m) m->set_keep_residual(o.error_feedback);
    return m;
  };
  // The whole-gradient sparse methods: every compressing method but powersgd (method_names.h).
  if (compresses_gradient(o.method) && o.method != "powersgd")
    method = kept.empty() ? sparse(n)
                          : std::make_unique<KeepDenseSync>(comm, *views, kept, sparse, o.bucket_mb, o.wire_dtype);
  if (o.method == "powersgd") {
    if (!views) throw std::invalid_argument("sync.method 'powersgd' needs the model's tensor shapes");
    auto powersgd = std::make_unique<PowerSgd>(comm, *views, n, o.rank, o.min_compression_rate, o.seed,
                                               models::cpu_backend(), o.wire_dtype, o.bucket_mb, buckets, kept);
    powersgd->set_keep_residual(o.error_feedback);
    method = std::move(powersgd);
  }
  if (!method) {
    std::string list;
    for (const auto& name : sync_method_names()) list += (list.empty() ? "" : ", ") + name;
    throw std::invalid_argument("unknown sync.method '" + o.method + "' (available: " + list + ")");
  }
  if (o.dense_warmup_steps > 0)
    return std::make_unique<WarmupSync>(std::move(method), comm, n, o.bucket_mb, o.dense_warmup_steps, backend,
                                        o.wire_dtype, buckets);
  return method;
}

}  // namespace trainer::comm
