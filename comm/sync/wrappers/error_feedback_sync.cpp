#include "comm/sync/wrappers/error_feedback_sync.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

AccordionOptions adaptive_options(const SyncOptions& o) {
  const auto keys = options_of<CompressorOptions>(o);
  AccordionOptions a;
  a.threshold = keys.adaptive_threshold;
  // 0 when neither is known (--dry-run builds the method without the data): Accordion refuses steps then.
  a.interval = keys.adaptive_interval > 0 ? keys.adaptive_interval : std::max<int64_t>(0, o.recipe.steps_per_epoch);
  a.lr_decay_steps = o.recipe.lr_decay_steps;
  return a;
}

// A speech model compressed after a short dense warmup ended 10 to 20 CER points behind dense on
// the LAS quickstart; a fifth of the run dense, with PowerSGD at rank 8 instead of 2 or with the
// decoder kept dense, closed nearly all of it (BENCHMARKS.md, "Methods that sync rarely, on speech"
// and "Which of LAS's tensors"). An image model compressed from its first step: issue 33's runs on
// the real CIFAR-10 (ResNet-20, 4 ranks x 128, 585 steps) ended 6 and 14 points below dense; the
// CIFAR studies dense-warm a twelfth of the run. Both notes say their horizon: a short run's gap is
// not a long run's (issue 50: Ok-Top-k 1% + DGC -6.2 points at 585 steps, -0.3 at 4,680).
std::vector<std::string> short_warmup_notes(const SyncOptions& o) {
  const std::string& method = o.method;
  const int64_t warmup = o.dense_warmup_steps;
  if (!o.recipe.speech && warmup == 0)
    return {"note: " + method + " from the first step (sync.dense_warmup_steps = 0): on CIFAR-10 "
            "(ResNet-20, 4 processes x 128, 6 epochs = 585 steps) compressed runs without a dense warmup ended 6 to "
            "14 points below dense's 71.4% (powersgd rank 2 65.4%, oktopk density 0.01 57.7%); a short run judges "
            "speed, the gap closes as a run lengthens; this project's CIFAR studies run a twelfth of the steps "
            "dense first (BENCHMARKS.md)"};
  if (!o.recipe.speech || warmup * 10 >= o.recipe.total_steps) return {};
  return {"note: " + method + " after " + std::to_string(warmup) + " dense steps (sync.dense_warmup_steps) of " +
          std::to_string(o.recipe.total_steps) +
          ": on the LAS quickstart (25 epochs = 1,250 steps), compressed runs this short of dense ended 10 to 20 CER points behind dense's "
          "16.8% (Ok-Top-k 1% 36.8%, PowerSGD rank 2 38.6%); a fifth of the run dense gave 27.1% and 26.4%, "
          "and with it PowerSGD at rank 8 17.5%, or rank 2 with the decoder kept dense (keep_dense) 18.5% "
          "(BENCHMARKS.md)"};
}

// The figures: Ok-Top-k at density 0.01 on CIFAR-10's ResNet-20 at P = 4 (issue 50; BENCHMARKS.md,
// "What compression costs as training lengthens"): with DGC on the real data -6.2 points at 5.9
// delays, -3.4 at 23, -0.3 at 47; on the hard CIFAR -7.0 (plain) and -15.7 (DGC) at 4.7, -3.0 and
// -3.1 at 19, with DGC -0.1 at 75 (7,488 steps, three seeds). One seed each elsewhere. The note stays at 20 delays: the
// grids' density-0.1 default lasts 43 at 468 steps, and no single count of delays separates the
// runs within a point from the rest (0.1 at 43 delays is -3.4 over three seeds).
std::vector<std::string> short_horizon_notes(const SyncOptions& o, double density) {
  const int64_t compressed = o.recipe.total_steps - o.dense_warmup_steps;
  const double delays = static_cast<double>(compressed) * density;
  if (o.recipe.total_steps <= 0 || compressed <= 0 || delays >= 20) return {};
  std::ostringstream what;
  what << o.method << " at density " << density << " for " << compressed
       << " compressed steps: steps x density = " << std::fixed << std::setprecision(1) << delays;
  return {"note: " + what.str() +
          " error-feedback delays (an entry left out waits about 1/density steps), a horizon that judges speed "
          "of convergence, not final accuracy; on CIFAR-10's ResNet-20 at density 0.01 Ok-Top-k with DGC ended "
          "6.2 points below dense at 5.9 delays (585 steps), 3.4 at 23 (2,340) and 0.3 at 47 (4,680), and on the "
          "hard synthetic CIFAR 15.7 at 4.7 (468), 3.1 at 19 (1,872) and 0.1 at 75 (7,488; three seeds, one "
          "elsewhere; BENCHMARKS.md)"};
}

SyncStats ErrorFeedbackSync::reduce(SyncBuffers& b, int64_t step) {
  if (b.n != ef_.size())
    throw std::invalid_argument(name() + ": gradient of " + std::to_string(b.n) + " entries, the method was built for " +
                                std::to_string(ef_.size()));
  if (warmup_.on()) apply_density(warmup_.density_at(step), /*fresh=*/true);
  if (dgc_) {
    // u = m u + g: what error feedback accumulates from here on is the velocity, not g.
    dgc_->correct_local(b.grads);
    // ef_ may have been replaced by a load since the last step: the passes find u again here.
    if (ef_.device()) ef_.set_cleared_with(dgc_->device_velocity());
  }
  ErrorFeedback::Step feedback(ef_, b.grads);
  SyncStats stats = compress(b, step, feedback);
  if (!feedback.formed()) throw std::logic_error(name() + ": a compressed step that never formed acc = grad + residual");
  if (dgc_) {
    dgc_->mask(ef_);  // momentum factor masking: u = 0 where the residual was cleared
    dgc_->add_decay(b.grads, b.params);
  }
  if (!keep_residual_) ef_.clear_all();
  if (warmup_.on()) stats.density_target = high_setting_;
  if (accordion_) {
    SyncStats adaptive = stats;
    adaptive.low_compression = accordion_->low_fraction();  // the setting this step ran at
    if (accordion_->add(b.grads, step)) {
      adapt(accordion_->low(), /*fresh=*/true);
      CommLog& log = comm_for_log_->log();
      const int64_t t = log.now_us();
      log.record("ADAPTIVE_SWITCH", 0, 0, -1, t, t);
    }
    return adaptive;
  }
  return stats;
}

void ErrorFeedbackSync::dense_warmup_step(SyncBuffers& b) {
  if (!dgc_) return;
  dgc_->correct_averaged(b.grads);
  dgc_->add_decay(b.grads, b.params);
}

void ErrorFeedbackSync::enable_dgc(const DgcSettings& settings) {
  dgc_ = std::make_unique<DgcMomentum>(ef_.size(), ef_.device() ? *ef_.device() : models::cpu_backend(), settings);
}

void ErrorFeedbackSync::enable_density_warmup(const DensityWarmup& warmup) {
  if (accordion_) throw std::invalid_argument("density_warmup_steps: not with adaptive, which sets the density itself");
  warmup_ = warmup;
  if (warmup_.on()) apply_density(warmup_.density_at(0), /*fresh=*/false);
}

void ErrorFeedbackSync::apply_density(double density, bool fresh) {
  if (density == high_setting_) return;
  high_setting_ = density;
  adapt(std::vector<uint8_t>{0}, fresh);  // one group, at its "high compression" setting: the density
}

std::string ErrorFeedbackSync::dgc_note() const {
  std::ostringstream out;
  if (dgc_) {
    const DgcSettings& s = dgc_->settings();
    out << "\nDGC (dgc): this method owns SGD's momentum (optim.momentum = " << s.momentum
        << (s.nesterov ? ", Nesterov" : "") << "; the optimizer steps without it): per rank u = m u + g, the "
        << "residual accumulates u, u cleared where an entry was sent (momentum factor masking)";
    if (s.weight_decay > 0)
      out << "; coupled weight decay " << s.weight_decay << " with its own dense momentum, added after the sync";
    if (s.clip_norm > 0)
      out << "; local clipping: each rank's gradient at optim.grad_clip_norm / sqrt(" << s.ranks
          << ") = " << s.clip_norm / std::sqrt(static_cast<double>(s.ranks))
          << " before the momentum, nothing clipped after the sync";
  }
  if (warmup_.on()) {
    out << "\nsparsity warm-up (density_warmup_*): density";
    for (int64_t i = 0; i < warmup_.stages; ++i)
      out << " " << warmup_.start * std::pow(warmup_.target / warmup_.start, static_cast<double>(i) / warmup_.stages);
    out << " in " << warmup_.stages << " stages over " << warmup_.steps << " steps, then " << warmup_.target;
  }
  return out.str();
}

void ErrorFeedbackSync::save_dgc(std::ostream& out) const {
  if (!dgc_ && !warmup_.on()) return;
  write_sync_header(out, "dgc", 1);
  write_pod(out, high_setting_);  // the density in use (the warm-up's stage)
  write_pod(out, static_cast<uint8_t>(dgc_ != nullptr));
  if (dgc_) dgc_->save(out);
}

void ErrorFeedbackSync::load_dgc(const std::vector<std::istream*>& saved) {
  const bool on = dgc_ || warmup_.on();
  double density = 0;
  for (size_t r = 0; r < saved.size(); ++r) {
    std::istream& in = *saved[r];
    const bool has = peek_sync_method(in) == "dgc";
    if (has != on)
      throw std::runtime_error(name() + " state was saved " + (has ? "with" : "without") +
                               " dgc or a sparsity warm-up (density_warmup_*), this run has " +
                               (has ? "neither" : "one"));
    if (!on) return;
    read_sync_header(in, "dgc", 1);
    const auto d = read_pod<double>(in);
    const auto velocity = read_pod<uint8_t>(in);
    if (!in) throw std::runtime_error(name() + " dgc state: truncated");
    if (r == 0) density = d;
    if (d != density)
      throw std::runtime_error(name() + " dgc state of saved rank " + std::to_string(r) +
                               " runs at another density than rank 0's");
    if ((velocity != 0) != (dgc_ != nullptr))
      throw std::runtime_error(name() + " state was saved with dgc = " + (velocity ? "true" : "false") +
                               ", this run has dgc = " + (velocity ? "false" : "true"));
  }
  if (!on) return;
  if (dgc_) {
    if (saved.size() == 1)
      dgc_->load(*saved[0]);
    else
      dgc_->load_mean(saved);
  }
  if (warmup_.on()) apply_density(density, /*fresh=*/false);
}

void ErrorFeedbackSync::enable_adaptive(Communicator& comm, std::vector<AccordionGroup> groups,
                                        const AccordionOptions& options, double high, double low) {
  accordion_ = std::make_unique<Accordion>(ef_.size(), std::move(groups), options);
  comm_for_log_ = &comm;
  high_setting_ = high;
  low_setting_ = low;
  adapt(accordion_->low(), /*fresh=*/false);
}

std::string ErrorFeedbackSync::adaptive_note(const char* what) const {
  if (!accordion_) return "";
  std::ostringstream out;
  out << "\nadaptive compression (adaptive, Accordion): " << what << " " << low_setting_
      << " while the gradient norm of a group changes by at least " << accordion_->options().threshold
      << " of itself between intervals of "
      << (accordion_->options().interval > 0 ? std::to_string(accordion_->options().interval) + " steps"
                                             : std::string("an epoch"))
      << " (and after a learning-rate "
      << "drop), " << what << " " << high_setting_ << " otherwise; starts at " << low_setting_ << "; "
      << accordion_->low().size() << " group(s)";
  return out.str();
}

void ErrorFeedbackSync::save_adaptive(std::ostream& out) const {
  if (!accordion_) return;
  accordion_->save(out);
  // The two settings: another pair would give the compressor's saved state other sizes.
  write_pod(out, high_setting_);
  write_pod(out, low_setting_);
}

void ErrorFeedbackSync::load_adaptive(std::istream& in) {
  const bool saved = peek_sync_method(in) == "accordion";
  if (saved != (accordion_ != nullptr))
    throw std::runtime_error(name() + " state was saved with adaptive = " + (saved ? "true" : "false") +
                             ", this run has adaptive = " + (saved ? "false" : "true"));
  if (!accordion_) return;
  std::stringstream before;
  accordion_->save(before);
  accordion_->load(in);
  const auto high = read_pod<double>(in), low = read_pod<double>(in);
  if (!in || high != high_setting_ || low != low_setting_) {
    accordion_->load(before);
    std::ostringstream what;
    what << name() << " state was saved adapting between " << high << " and " << low << ", this run adapts between "
         << high_setting_ << " and " << low_setting_ << " (rank and adaptive_rank, or density and "
         << "adaptive_density)";
    throw std::runtime_error(in ? what.str() : name() + " adaptive compression state: truncated");
  }
  adapt(accordion_->low(), /*fresh=*/accordion_->fresh_switch());
}

void ErrorFeedbackSync::save(std::ostream& out) const {
  save_adaptive(out);
  save_state(out);
  ef_.save(out);
  save_dgc(out);
}

void ErrorFeedbackSync::load(std::istream& in) {
  std::stringstream before;  // the compressor's state is small (no residual): kept to roll back
  save_adaptive(before);
  save_state(before);
  ErrorFeedback residual(ef_.size(), ef_.device());
  try {
    load_adaptive(in);
    load_state(in);
    residual.load(in, name().c_str());
    load_dgc({&in});
  } catch (...) {
    load_adaptive(before);
    load_state(before);
    throw;
  }
  ef_ = std::move(residual);
}

std::string ErrorFeedbackSync::merge_state(const std::vector<std::istream*>& saved) {
  std::string first;
  for (size_t r = 0; r < saved.size(); ++r) {
    load_state(*saved[r]);
    std::ostringstream back;
    save_state(back);
    if (r == 0) first = back.str();
    if (back.str() != first)
      throw std::runtime_error(name() + " state of saved rank " + std::to_string(r) +
                               " differs from rank 0's, though the method keeps it equal on every rank");
  }
  std::istringstream rank0(first);
  load_state(rank0);
  return "state kept (equal on every rank)";
}

std::string ErrorFeedbackSync::load_resharded(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error(name() + ": no saved state to resume from");
  std::stringstream before;
  save_state(before);
  std::vector<std::istringstream> streams;
  for (const std::string& s : states) streams.emplace_back(s);
  std::vector<std::istream*> saved;
  for (auto& s : streams) saved.push_back(&s);
  ErrorFeedback residual(ef_.size(), ef_.device());
  std::string what;
  std::stringstream adaptive_before;
  save_adaptive(adaptive_before);
  try {
    // The detector sees the averaged gradient only, so every saved rank holds the same state.
    std::string first;
    for (size_t r = 0; r < saved.size(); ++r) {
      load_adaptive(*saved[r]);
      std::ostringstream back;
      save_adaptive(back);
      if (r == 0) first = back.str();
      if (back.str() != first)
        throw std::runtime_error(name() + " adaptive compression state of saved rank " + std::to_string(r) +
                                 " differs from rank 0's");
    }
    what = merge_state(saved);
    residual.load_mean(saved, name().c_str());
    load_dgc(saved);
  } catch (...) {
    load_adaptive(adaptive_before);
    load_state(before);
    throw;
  }
  ef_ = std::move(residual);
  return name() + ": " + what + "; residual" + (dgc_ ? " and DGC velocity" : "") + ": the mean of the " +
         std::to_string(states.size()) + " saved ranks' (float64, rank order)";
}

}  // namespace trainer::comm
