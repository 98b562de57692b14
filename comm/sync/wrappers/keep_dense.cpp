#include "comm/sync/wrappers/keep_dense.h"

#include <fnmatch.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/methods/dense/dense.h"

namespace trainer::comm {
namespace {

std::vector<std::string> split_patterns(const std::string& patterns) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= patterns.size()) {
    const size_t comma = std::min(patterns.find(',', at), patterns.size());
    std::string p = patterns.substr(at, comma - at);
    p.erase(0, p.find_first_not_of(" \t"));
    p.erase(p.find_last_not_of(" \t") + 1);
    if (!p.empty()) out.push_back(p);
    at = comma + 1;
  }
  return out;
}

KeepDenseSync::Split split_gradient(const std::vector<models::ParamView>& views, const std::vector<bool>& kept) {
  if (kept.size() != views.size()) throw std::invalid_argument("keep_dense: one flag per tensor expected");
  KeepDenseSync::Split s;
  for (size_t v = 0; v < views.size(); ++v) {
    const int64_t numel = views[v].numel();
    if (numel == 0) continue;
    auto& ranges = kept[v] ? s.kept : s.compressed;
    (kept[v] ? s.kept_count : s.compressed_count) += numel;
    if (!ranges.empty() && ranges.back().offset + ranges.back().count == views[v].offset)
      ranges.back().count += numel;
    else
      ranges.push_back({views[v].offset, numel});
  }
  if (s.kept_count == 0) throw std::invalid_argument("keep_dense keeps no tensor with entries");
  if (s.compressed_count == 0)
    throw std::invalid_argument("keep_dense keeps every tensor dense: nothing is left to compress "
                                "(sync.method = \"dense\" is that run)");
  return s;
}

std::string number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

void gather(const std::vector<KeepDenseSync::Range>& ranges, const float* from, float* to) {
  for (const auto& r : ranges) to = std::copy(from + r.offset, from + r.offset + r.count, to);
}

void scatter(const std::vector<KeepDenseSync::Range>& ranges, const float* from, float* to) {
  for (const auto& r : ranges) {
    std::copy(from, from + r.count, to + r.offset);
    from += r.count;
  }
}

}  // namespace

std::vector<bool> match_keep_dense(const std::string& patterns, const std::vector<models::ParamView>& views) {
  std::vector<bool> kept(views.size(), false);
  for (const std::string& pattern : split_patterns(patterns)) {
    bool any = false;
    for (size_t v = 0; v < views.size(); ++v)
      if (fnmatch(pattern.c_str(), views[v].name.c_str(), 0) == 0) kept[v] = any = true;
    if (!any)
      throw std::invalid_argument("keep_dense: '" + pattern + "' matches no parameter tensor of the model" +
                                  (views.empty() ? std::string() : " (names look like '" + views.front().name + "')"));
  }
  return kept;
}

SyncMethod sparse_method(std::string name, std::string doc, SparseFactory make) {
  SyncMethod m;
  m.name = std::move(name);
  m.doc = std::move(doc);
  m.can.compresses = true;
  m.can.device_buffers = true;
  declare_options<SparseOptions>(m);
  m.needs_host_buffers = [](const SyncSettings& o) {
    const auto s = options_of<SparseOptions>(o);
    return s.adaptive || !s.keep_dense.empty() || o.wire() != WireDType::kF32;
  };
  m.check = [](const SyncOptions& o) {
    const auto s = options_of<SparseOptions>(o);
    std::vector<SyncOptionProblem> problems;
    if (s.adaptive && !(s.adaptive_density > s.density))
      problems.push_back({{"adaptive_density", "density"},
                          "adaptive_density = " + number(s.adaptive_density) +
                              " must be above density = " + number(s.density) +
                              " (adaptive: the density of critical regimes, the lower compression)"});
    if (s.dgc && !s.keep_dense.empty())
      problems.push_back({{"dgc", "keep_dense"},
                          "dgc owns the optimizer's momentum, which the tensors of keep_dense would then lack: "
                          "not together yet"});
    if (s.dgc && !s.error_feedback)
      problems.push_back({{"dgc", "error_feedback"},
                          "dgc accumulates the velocity in error feedback's residual: it needs "
                          "error_feedback = true"});
    if (s.dgc && o.recipe.optimizer != "sgd")
      problems.push_back({{"dgc", "optim.name"},
                          "dgc applies to optim.name = \"sgd\", not \"" + o.recipe.optimizer +
                              "\": DGC carries SGD's momentum in the method (a velocity accumulated into the residual); "
                              "Adam's moments normalize the averaged gradient per entry after the sync and cannot move "
                              "before it"});
    const bool warmup = s.density_warmup_steps > 0 || s.density_warmup_epochs > 0;
    if (s.density_warmup_steps > 0 && s.density_warmup_epochs > 0)
      problems.push_back({{"density_warmup_steps", "density_warmup_epochs"},
                          "density_warmup_steps and density_warmup_epochs both set: give its length once"});
    if (warmup && s.adaptive)
      problems.push_back({{"density_warmup_steps", "adaptive"},
                          "a sparsity warm-up (density_warmup_*) is not with adaptive, which sets the density "
                          "itself"});
    if (warmup && !(s.density_warmup_start > s.density))
      problems.push_back({{"density_warmup_start", "density"},
                          "density_warmup_start = " + number(s.density_warmup_start) +
                              " must be above density = " + number(s.density) +
                              " (the sparsity warm-up falls from it to density)"});
    return problems;
  };
  m.defaults = [](const SyncOptions& o) -> std::vector<MethodDefault> {
    if (!options_of<SparseOptions>(o).adaptive) return {};
    return {{"density", 0.01,
             "the sparse methods' density outside critical regimes under adaptive (ten times below "
             "adaptive_density's 0.1, Accordion's ratio; this pair is not measured here yet)"}};
  };
  m.owns_momentum = [](const SyncSettings& o) { return options_of<SparseOptions>(o).dgc; };
  m.owns_clipping = [](const SyncSettings& o) { return options_of<SparseOptions>(o).dgc; };
  m.start_notes = [](const SyncOptions& o) {
    std::vector<std::string> notes = short_warmup_notes(o);
    const auto s = options_of<SparseOptions>(o);
    if (!s.adaptive)  // under adaptive the density changes with the regime
      for (std::string& note : short_horizon_notes(o, s.density)) notes.push_back(std::move(note));
    if (s.dgc)
      notes.push_back("note: " + o.key_path("dgc") + " = true: " + o.method + " owns SGD's momentum (optim.momentum = " + number(o.recipe.momentum) +
                      " and optim.nesterov), the coupled optim.weight_decay, and optim.grad_clip_norm when set (each "
                      "rank clips its own gradient at C / sqrt(processes) before the momentum); the optimizer steps "
                      "without momentum and nothing is clipped after the sync");
    return notes;
  };
  m.make = [make](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    const auto s = options_of<SparseOptions>(o);
    auto method = [&](int64_t count) -> std::unique_ptr<GradientSync> {
      // The lists are host arrays: on a device run, the MPI side of the device's communicator.
      std::unique_ptr<ErrorFeedbackSync> sparse = make(o, c.comm.host_side(), count, c.backend);
      sparse->set_keep_residual(s.error_feedback);
      if (s.dgc)
        sparse->enable_dgc(DgcSettings{o.recipe.momentum, o.recipe.nesterov, o.recipe.grad_clip_norm, c.comm.size(), o.recipe.coupled_weight_decay});
      DensityWarmup warmup;
      warmup.steps = s.density_warmup_steps > 0 ? s.density_warmup_steps : s.density_warmup_epochs * o.recipe.steps_per_epoch;
      warmup.start = s.density_warmup_start;
      warmup.stages = s.density_warmup_stages;
      warmup.target = s.density;
      sparse->enable_density_warmup(warmup);
      // One k over the flat gradient, so one group: the whole gradient (accordion.h).
      if (s.adaptive) sparse->enable_adaptive(c.comm, {{0, count}}, adaptive_options(o), s.density, s.adaptive_density);
      return sparse;
    };
    if (c.kept.empty()) return method(c.n);
    // The kept values live in host vectors (needs_host_buffers: never on a device's buffers).
    return std::make_unique<KeepDenseSync>(c.comm, c.host_backend(o.method), *c.views, c.kept, method, o.bucket_mb,
                                           o.wire());
  };
  return m;
}

KeepDenseSync::KeepDenseSync(Communicator& comm, models::Backend& backend, const std::vector<models::ParamView>& views,
                             const std::vector<bool>& kept,
                             const std::function<std::unique_ptr<GradientSync>(int64_t)>& make_method,
                             double bucket_mb, WireDType wire)
    : comm_(comm),
      backend_(backend),
      split_(split_gradient(views, kept)),
      method_(make_method(split_.compressed_count)),
      bucket_elements_(bucket_elements(bucket_mb)),
      wire_(wire),
      kept_values_(split_.kept_count),
      compressed_values_(split_.compressed_count) {}

std::string KeepDenseSync::describe() const {
  return method_->describe() + " (over the " + std::to_string(split_.compressed_count) +
         " entries not kept dense)\ntensors kept dense (keep_dense): " + std::to_string(split_.kept_count) +
         " entries, averaged every step after the method by ALLREDUCE_DENSE in buckets of " +
         std::to_string(bucket_elements_) + " floats, on the wire as " + wire_dtype_name(wire_);
}

SyncStats KeepDenseSync::reduce(SyncBuffers& b, int64_t step) {
  const int64_t n = split_.kept_count + split_.compressed_count;
  if (b.n != n) throw std::logic_error("KeepDenseSync: the gradient's size changed");
  gather(split_.compressed, b.grads, compressed_values_.data());
  SyncBuffers compressed{nullptr, compressed_values_.data(), split_.compressed_count};
  SyncStats stats = method_->reduce(compressed, step);
  scatter(split_.compressed, compressed_values_.data(), b.grads);

  gather(split_.kept, b.grads, kept_values_.data());
  allreduce_average(comm_, backend_, kept_values_.data(), split_.kept_count, bucket_elements_,
                    "ALLREDUCE_DENSE", wire_);
  scatter(split_.kept, kept_values_.data(), b.grads);

  stats.density = (stats.density * static_cast<double>(split_.compressed_count) + static_cast<double>(split_.kept_count)) /
                  static_cast<double>(n);
  return stats;
}

}  // namespace trainer::comm
