#include "comm/sync/error_feedback_sync.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

#include "comm/sync/compressor_options.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

AccordionOptions adaptive_options(const SyncOptions& o) {
  const auto keys = options_of<CompressorOptions>(o);
  AccordionOptions a;
  a.threshold = keys.adaptive_threshold;
  // 0 when neither is known (--dry-run builds the method without the data): Accordion refuses steps then.
  a.interval = keys.adaptive_interval > 0 ? keys.adaptive_interval : std::max<int64_t>(0, o.steps_per_epoch);
  a.lr_decay_steps = o.lr_decay_steps;
  return a;
}

// A speech model compressed after a short dense warmup ended 10 to 20 CER points behind dense on
// the LAS quickstart; a fifth of the run dense, with PowerSGD at rank 8 instead of 2 or with the
// decoder kept dense, closed nearly all of it (BENCHMARKS.md, "Methods that sync rarely, on speech"
// and "Which of LAS's tensors"). An image model compressed from its first step: issue 33's runs on
// CIFAR-10 (ResNet-20, 4 ranks, 6 epochs) ended 6 and 14 points below dense; the CIFAR studies
// dense-warm a twelfth of the run.
std::vector<std::string> short_warmup_notes(const SyncRecipe& recipe) {
  const std::string& method = recipe.sync.method;
  const int64_t warmup = recipe.sync.dense_warmup_steps;
  if (!recipe.speech && warmup == 0)
    return {"note: " + method + " from the first step (sync.dense_warmup_steps = 0): on CIFAR-10 "
            "(ResNet-20, 4 processes, 6 epochs) compressed runs without a dense warmup ended 6 to 14 points below "
            "dense's 71.4% (powersgd 65.4%, oktopk 57.7%); this project's CIFAR studies run a twelfth of the steps "
            "dense first (BENCHMARKS.md)"};
  if (!recipe.speech || warmup * 10 >= recipe.total_steps) return {};
  return {"note: " + method + " after " + std::to_string(warmup) + " dense steps (sync.dense_warmup_steps) of " +
          std::to_string(recipe.total_steps) +
          ": on the LAS quickstart, compressed runs this short of dense ended 10 to 20 CER points behind dense's "
          "16.8% (Ok-Top-k 1% 36.8%, PowerSGD rank 2 38.6%); a fifth of the run dense gave 27.1% and 26.4%, "
          "and with it PowerSGD at rank 8 17.5%, or rank 2 with the decoder kept dense (sync.keep_dense) 18.5% "
          "(BENCHMARKS.md)"};
}

SyncStats ErrorFeedbackSync::reduce(SyncBuffers& b, int64_t step) {
  if (b.n != ef_.size())
    throw std::invalid_argument(name() + ": gradient of " + std::to_string(b.n) + " entries, the method was built for " +
                                std::to_string(ef_.size()));
  ErrorFeedback::Step feedback(ef_, b.grads);
  const SyncStats stats = compress(b, step, feedback);
  if (!feedback.formed()) throw std::logic_error(name() + ": a compressed step that never formed acc = grad + residual");
  if (!keep_residual_) ef_.clear_all();
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
  out << "\nadaptive compression (sync.adaptive, Accordion): " << what << " " << low_setting_
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
    throw std::runtime_error(name() + " state was saved with sync.adaptive = " + (saved ? "true" : "false") +
                             ", this run has sync.adaptive = " + (saved ? "false" : "true"));
  if (!accordion_) return;
  std::stringstream before;
  accordion_->save(before);
  accordion_->load(in);
  const auto high = read_pod<double>(in), low = read_pod<double>(in);
  if (!in || high != high_setting_ || low != low_setting_) {
    accordion_->load(before);
    std::ostringstream what;
    what << name() << " state was saved adapting between " << high << " and " << low << ", this run adapts between "
         << high_setting_ << " and " << low_setting_ << " (sync.rank and sync.adaptive_rank, or sync.density and "
         << "sync.adaptive_density)";
    throw std::runtime_error(in ? what.str() : name() + " adaptive compression state: truncated");
  }
  adapt(accordion_->low(), /*fresh=*/accordion_->fresh_switch());
}

void ErrorFeedbackSync::save(std::ostream& out) const {
  save_adaptive(out);
  save_state(out);
  ef_.save(out);
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
  } catch (...) {
    load_adaptive(adaptive_before);
    load_state(before);
    throw;
  }
  ef_ = std::move(residual);
  return name() + ": " + what + "; residual: the mean of the " + std::to_string(states.size()) +
         " saved ranks' (float64, rank order)";
}

}  // namespace trainer::comm
