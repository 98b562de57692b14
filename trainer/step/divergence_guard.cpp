#include "trainer/step/divergence_guard.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <vector>

#include "trainer/config/config_schema.h"

namespace trainer::app {

DivergenceWatch::DivergenceWatch(int64_t switch_step, int64_t window, double factor, int64_t first_step,
                                 double start_factor)
    : switch_(switch_step),
      window_(window),
      factor_(factor),
      first_(first_step),
      reference_(std::numeric_limits<double>::quiet_NaN()),
      start_factor_(start_factor) {
  if (switch_ < 0) return;
  // Always a whole window: the mean of fewer steps (a warmup of 1, the untrained loss) is too noisy
  // a yardstick (on synthetic curves a 1-step reference tripped normal runs at 1.5 x).
  if (switch_ - first_step >= window_) {  // the level the dense steps reached: the window ending at the switch
    ref_begin_ = switch_ - window_;
    ref_end_ = switch_;
  } else {  // a short or no warmup, or resumed past or near the switch: the first window this process runs
    ref_begin_ = first_step;
    ref_end_ = first_step + window_;
  }
  align_ = ref_end_;
}

void DivergenceWatch::restore(double reference, int64_t end) {
  if (!watching() || end < 0 || end > first_ || !std::isfinite(reference)) return;
  reference_ = reference;
  ref_end_ = end;
  ref_begin_ = std::max<int64_t>(0, end - window_);
  align_ = first_;  // whole windows from the resume on
}

void DivergenceWatch::add(int64_t step, double loss, int64_t samples) {
  if (!watching() || step < first_ || !std::isfinite(loss)) return;
  loss_sum_ += loss * static_cast<double>(samples);
  samples_ += static_cast<double>(samples);
}

bool DivergenceWatch::closes(int64_t step) const {
  if (!watching()) return false;
  const int64_t end = step + 1;
  // The windows before the reference's end too (the dense steps, judged against the start).
  return end == ref_end_ || (end > first_ && (end - align_) % window_ == 0);
}

DivergenceWatch::Verdict DivergenceWatch::close(int64_t step, double loss_sum, double samples) {
  Verdict v;
  v.end = step + 1;
  v.begin = v.end == ref_end_ ? ref_begin_ : std::max(first_, v.end - window_);
  loss_sum_ = samples_ = 0;
  if (samples <= 0) return v;  // every step of the window was skipped: nothing to judge
  v.mean = loss_sum / samples;
  const bool started = std::isfinite(start_);
  v.above_start = started && (!std::isfinite(v.mean) || v.mean > start_factor_ * start_);
  if (v.end < ref_end_ || std::isnan(reference_)) {
    // A window of dense steps before the reference, or the reference (or the first window after it
    // with any applied step): judged against the start alone.
    if (v.end >= ref_end_) {
      reference_ = v.mean;
      if (v.end != ref_end_) ref_begin_ = v.begin, ref_end_ = v.end;
    }
    v.judged = started;
    v.diverged = v.above_start;
    return v;
  }
  v.judged = true;
  v.above_reference = !std::isfinite(v.mean) || v.mean > factor_ * reference_;
  v.diverged = v.above_reference || v.above_start;
  return v;
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::string method_settings(const Config& config) {
  // The method's own keys, as its table entry declares them (comm/sync/registry.h).
  std::string keys;
  for (const comm::OptionKey& key : comm::sync_method(config.sync.method).keys)
    keys += (keys.empty() ? "" : ", ") + key.path + " = " + config_schema::toml_literal(config.sync.keys.at(key.path));
  std::string out = "sync.method = " + config.sync.method + " (";
  if (!keys.empty()) out += keys + "; ";
  return out + "sync.dense_warmup_steps = " + std::to_string(config.sync.dense_warmup_steps) +
         ", optim.lr = " + number(config.optim.lr) + ")";
}

DivergenceGuard::DivergenceGuard(const Config& config, int64_t switch_step, int64_t first_step,
                                 comm::Communicator& comm, double kept_reference, int64_t kept_reference_end,
                                 double kept_start)
    : watch_(switch_step, config.train.divergence_window, config.train.divergence_factor, first_step,
             config.train.divergence_start_factor),
      comm_(comm),
      settings_(method_settings(config)) {
  watch_.restore(kept_reference, kept_reference_end);
  watch_.set_start(kept_start);
}

std::string DivergenceGuard::where() const {
  const int64_t s = watch_.switch_step();
  return s > 0 ? "after its dense warmup (switched after step " + std::to_string(s) + ")"
               : std::string("from its first step (no dense warmup)");
}

std::optional<std::string> DivergenceGuard::after_step(int64_t step, double loss, int64_t samples, bool applied,
                                                       const std::string& last_checkpoint) {
  if (!watch_.watching()) return std::nullopt;
  // The run's start: its first step's loss over every rank (a step skipped everywhere leaves none).
  if (step == 0) {
    const bool finite = applied && std::isfinite(loss);
    const auto [sum, n] = agreed(finite ? loss * static_cast<double>(samples) : 0.0,
                                 finite ? static_cast<double>(samples) : 0.0);
    if (n > 0) watch_.set_start(sum / n);
  }
  if (applied) watch_.add(step, loss, samples);
  if (!watch_.closes(step)) return std::nullopt;
  const auto [sum, samples_all] = agreed(watch_.local_loss_sum(), watch_.local_samples());
  const DivergenceWatch::Verdict v = watch_.close(step, sum, samples_all);
  if (!v.diverged) {
    if (v.judged || v.end == watch_.reference_end()) last_good_ = last_checkpoint;
    return std::nullopt;
  }
  last_mean_ = v.mean;
  const bool before_switch = v.end <= watch_.switch_step();
  return "diverged: " + settings_ + " " + (before_switch ? in_warmup() : where()) + ": the mean training loss over the " +
         std::to_string(v.end - v.begin) + " steps to step " + std::to_string(v.end) + " is " + number(v.mean) +
         ", above " + (v.above_reference ? reference_text() : start_text());
}

std::pair<double, double> DivergenceGuard::agreed(double loss_sum, double samples) {
  // Summed in rank order on every rank: the same bits everywhere, so the same decision (an
  // allreduce's sum need not be bitwise equal across ranks).
  const double mine[2] = {loss_sum, samples};
  std::vector<double> all(2 * static_cast<size_t>(comm_.size()));
  comm_.allgather(mine, 2, all.data(), comm::DType::kF64, "ALLGATHER_DIVERGENCE");
  double sum = 0, n = 0;
  for (int r = 0; r < comm_.size(); ++r) sum += all[2 * r], n += all[2 * r + 1];
  return {sum, n};
}

std::string DivergenceGuard::in_warmup() const {
  return "in its dense warmup (the switch would come after step " + std::to_string(watch_.switch_step()) + ")";
}

std::string DivergenceGuard::start_text() const {
  return number(watch_.start_factor()) + " x the " + number(watch_.start()) + " of the run's first step";
}

std::string DivergenceGuard::reference_text() const {
  const std::string which = watch_.reference_end() == watch_.switch_step() ? "before the switch"
                            : watch_.reference_begin() == 0              ? "the run's first window"
                                                                         : "the first window after the resume";
  return number(watch_.factor()) + " x the " + number(watch_.reference()) + " of the " +
         std::to_string(watch_.reference_end() - watch_.reference_begin()) + " steps to step " +
         std::to_string(watch_.reference_end()) + " (" + which + ")";
}

std::optional<std::string> DivergenceGuard::nonfinite(int64_t step, double loss, int64_t samples,
                                                      bool loss_nonfinite, const std::string& what) {
  if (!watch_.after_switch(step)) return std::nullopt;
  // The steps since the last window closed, this one's finite loss included.
  const bool finite = std::isfinite(loss);
  const auto [sum, n] = agreed(watch_.local_loss_sum() + (finite ? loss * static_cast<double>(samples) : 0.0),
                               watch_.local_samples() + (finite ? static_cast<double>(samples) : 0.0));
  const double mean = n > 0 ? sum / n : std::numeric_limits<double>::quiet_NaN();
  const bool known = std::isfinite(watch_.reference());
  const bool above_reference = known && (!std::isfinite(mean) || mean > watch_.factor() * watch_.reference());
  const bool above_start =
      std::isfinite(watch_.start()) && (!std::isfinite(mean) || mean > watch_.start_factor() * watch_.start());
  const bool risen = n > 0 && (above_reference || above_start);
  if (!loss_nonfinite && !risen) return std::nullopt;
  std::string line = "diverged: " + settings_ + " " + where() + ": " + what;
  if (risen) {
    last_mean_ = mean;
    line += ", the mean training loss of its window so far at " + number(mean) + ", above " +
            (above_reference ? reference_text() : start_text());
  }
  return line;
}

std::string DivergenceGuard::stop_note(const std::string& written, const std::string& why_none) const {
  std::string note = written.empty() ? "no checkpoint written (" + why_none + ")"
                                     : "checkpoint of the state as it stopped: " + written;
  namespace fs = std::filesystem;
  if (last_good_.empty())
    note += "; last good checkpoint: none (none was complete while the loss was judged fine)";
  else if (!fs::exists(fs::path(last_good_) / "manifest.json"))
    note += "; last good checkpoint: none left (" + last_good_ + " was removed by train.keep_checkpoints)";
  else
    note += "; last good checkpoint: " + last_good_;
  return note + "; train.divergence_guard = false lets such a run go on";
}

nlohmann::json DivergenceGuard::record() const {
  nlohmann::json r{{"method", settings_},
                   {"switch_step", watch_.switch_step()},
                   {"factor", watch_.factor()},
                   {"reference_loss", watch_.reference()},
                   {"reference_steps", {watch_.reference_begin(), watch_.reference_end()}},
                   {"start_factor", watch_.start_factor()},
                   {"start_loss", std::isfinite(watch_.start()) ? nlohmann::json(watch_.start()) : nlohmann::json(nullptr)}};
  if (!std::isfinite(watch_.reference())) r["reference_loss"] = nullptr;
  r["window_loss"] = std::isfinite(last_mean_) ? nlohmann::json(last_mean_) : nlohmann::json(nullptr);
  return r;
}

}  // namespace trainer::app
