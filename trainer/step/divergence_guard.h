// The divergence guard (train.divergence_guard): a run whose sync method has switched from dense
// training (its dense warmup, or the first step when it has none) and whose training loss then rises
// well above where it was at the switch stops, with one "diverged:" line naming the method, its
// settings and the step, exit status kExitDiverged (trainer/agreed_error.h).
//
// Which runs: those whose sync reports a compressed phase at step sync.dense_warmup_steps
// (GradientSync::phase: every method but dense and async_ps). Dense has no switch to measure
// against, and its blow-ups are the recipe's (the non-finite guard covers their end); async_ps's
// workers do not take their steps together, so they have no step at which to agree.
//
// The signal: the mean training loss over windows of W = train.divergence_window steps, weighted by
// samples over every rank's batches. Two yardsticks: the run's start (the mean loss of its first step,
// agreed at step 0 and kept by checkpoints): every window, the dense ones before the switch
// included, above train.divergence_start_factor times it is divergence (a run that blows up before
// the level at the switch is known, or inside the window that measures it); and the level at the
// switch, as follows. The reference is the window that ends at the switch (the W
// dense steps before it); with a warmup shorter than W (or none) it is the run's first W steps, so
// it is always a whole window. Checkpoints keep it (TrainingState::divergence_reference), so a
// resumed run is judged against the same level; one resumed from a checkpoint written before the
// reference was known takes the first W steps it runs (or the W before the switch). Each later
// window (aligned on the reference's end; after a resume, on the resume step) is compared with it:
// a mean above train.divergence_factor times the reference is divergence. A non-finite value
// after the switch that ends the run (past train.skip_nonfinite_steps) is divergence when the loss
// itself is non-finite on some rank, or when the mean loss of the steps since the last window
// (this one's finite losses included) is already above the factor: a blow-up within one window
// usually overflows a gradient before the loss (DiLoCo at outer lr 1e6: loss 2.5, 1.6e9, 6e17,
// then an infinite gradient). A NaN in a gradient while the loss is fine stays the non-finite
// guard's error (exit 3).
//
// Agreement and cost: no message per step. At the last step of each window every rank contributes
// its (loss x samples, samples) to one allgather of 2 doubles (ALLGATHER_DIVERGENCE), and every rank
// sums them in rank order: identical bits everywhere, so every rank decides the same and none waits
// in a collective. A non-finite step that ends the run adds one more, only where every rank knows of
// it (the step clock's verdict, before the sync).
//
// The stop: a finite state (the rising loss) is checkpointed at the detection step, for inspection
// or to go on with the guard off; a non-finite value writes none (the state no longer gives finite
// values). Either way the line names the last good checkpoint: the newest complete one when
// the last window passed (its loss was judged fine), if it is still on disk.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "trainer/config/config.h"

namespace trainer::app {

// The decision alone, without messages (unit-tested on synthetic curves). Steps are 0-based; a
// window [begin, end) closes after step end - 1.
class DivergenceWatch {
 public:
  // switch_step: the first compressed step, or -1 when the run is not watched. first_step: the
  // first step this process runs (a resume's). start_factor: against the run's start (set_start).
  DivergenceWatch(int64_t switch_step, int64_t window, double factor, int64_t first_step,
                  double start_factor = std::numeric_limits<double>::infinity());
  // A resume: the reference a checkpoint kept (its window ended at `end`, at or before the first
  // step); windows then start at the first step.
  void restore(double reference, int64_t end);
  // The run's start: the mean loss of its first step (the untrained model's, before any update)
  // over every rank's batches; from then on every window, the dense ones before the reference
  // included, is also judged against start_factor x it. One step: the next ones may already be the
  // blow-up (lr 10: 3.5, then hundreds), and an untrained model's loss hardly varies by batch (its
  // outputs are near uniform).
  void set_start(double start) { start_ = start; }
  double start() const { return start_; }
  double start_factor() const { return start_factor_; }

  bool watching() const { return switch_ >= 0; }
  // Whether `step` is at or after the switch (the steps a non-finite loss is divergence in).
  bool after_switch(int64_t step) const { return watching() && step >= switch_; }
  // This rank's share of the current window: called for every applied step.
  void add(int64_t step, double loss, int64_t samples);
  // Whether the window closes after `step` (every rank then agrees on its sums).
  bool closes(int64_t step) const;
  // This rank's sums of the window that closes now.
  double local_loss_sum() const { return loss_sum_; }
  double local_samples() const { return samples_; }

  struct Verdict {
    bool diverged = false;
    bool judged = false;  // compared with a yardstick: the reference (a window after it), or the
                          // start (any window once it is known); false for a window whose every
                          // step was skipped
    bool above_start = false;      // diverged against the start
    bool above_reference = false;  // diverged against the reference
    double mean = 0;      // the window's mean loss
    int64_t begin = 0, end = 0;
  };
  // The window that closes after `step`, from every rank's sums (identical on every rank).
  Verdict close(int64_t step, double loss_sum, double samples);

  double reference() const { return reference_; }  // NaN until the reference window closed
  int64_t reference_begin() const { return ref_begin_; }
  int64_t reference_end() const { return ref_end_; }
  int64_t switch_step() const { return switch_; }
  int64_t first_step() const { return first_; }
  double factor() const { return factor_; }

 private:
  int64_t switch_, window_;
  double factor_;
  int64_t ref_begin_ = 0, ref_end_ = 0;  // the reference window
  int64_t first_ = 0, align_ = 0;         // the first step; windows end at align_ + k W (k < 0 too)
  double reference_;
  double start_factor_;
  double start_ = std::numeric_limits<double>::quiet_NaN();
  double loss_sum_ = 0, samples_ = 0;
};

// "sync.method = diloco (sync.diloco.period = 1, sync.diloco.outer_lr = 0.7, ...; dense warmup 250
// steps; optim.lr = 0.5)": the method's own keys (its table), for the line.
std::string method_settings(const Config& config);

// The first compressed step of `config`'s method given its phase function, or -1: not watched.
template <class PhaseAt>
int64_t switch_step(const Config& config, PhaseAt compressed_at) {
  if (!config.train.divergence_guard) return -1;
  const int64_t s = config.sync.dense_warmup_steps;
  return compressed_at(s) ? s : -1;
}

// One rank's guard: the watch, the agreement and the line. `comm`: the training ranks, which take
// their steps together.
class DivergenceGuard {
 public:
  // kept_reference(_end): a resumed checkpoint's (TrainingState::divergence_reference); end -1: none.
  // kept_start: its kept start (TrainingState::divergence_start; NaN: none).
  DivergenceGuard(const Config& config, int64_t switch_step, int64_t first_step, comm::Communicator& comm,
                  double kept_reference = 0, int64_t kept_reference_end = -1,
                  double kept_start = std::numeric_limits<double>::quiet_NaN());

  // After each step's update (collective at a window's last step). Returns the "diverged: ..." line
  // when the window just closed diverged (the caller checkpoints and stops), else nothing.
  // `last_checkpoint`: the newest complete checkpoint now ("" when none).
  std::optional<std::string> after_step(int64_t step, double loss, int64_t samples, bool applied,
                                        const std::string& last_checkpoint);
  // The end of the line: what was written and what is good. `written`: the checkpoint of the
  // detection step ("" when none was written, `why_none` says why).
  std::string stop_note(const std::string& written, const std::string& why_none) const;
  // Collective after the switch: a non-finite value at `step` (`what`: "non-finite value at step
  // N: the gradient of ... on rank R ...") that ends the run, found by the step clock's verdict.
  // `loss_nonfinite`: the verdict names the loss; `loss`, `samples`: this rank's step. Returns the
  // "diverged: ..." line, or nothing: not after the switch, or a gradient's NaN while the loss was
  // fine (the non-finite guard's own error stands).
  std::optional<std::string> nonfinite(int64_t step, double loss, int64_t samples, bool loss_nonfinite,
                                       const std::string& what);

  // What metrics.jsonl's "diverged" record says besides the step and the line: the settings, the
  // switch, the reference and the window's mean (null for a non-finite loss).
  nlohmann::json record() const;

  const DivergenceWatch& watch() const { return watch_; }

 private:
  std::string where() const;  // "after its dense warmup of N steps" / "from its first step"
  std::string reference_text() const;  // "1.5 x the 2.74 of the 50 steps to step 250 (before the switch)"
  std::string start_text() const;      // "3 x the 3.52 of the run's first step"
  std::string in_warmup() const;       // "in its dense warmup (the switch would come after step 250)"
  // Every rank's (loss sum, samples), summed in rank order.
  std::pair<double, double> agreed(double loss_sum, double samples);

  DivergenceWatch watch_;
  comm::Communicator& comm_;
  std::string settings_;
  std::string last_good_;  // the newest complete checkpoint when the last window passed
  double last_mean_ = std::numeric_limits<double>::quiet_NaN();  // the diverged window's mean
};

}  // namespace trainer::app
