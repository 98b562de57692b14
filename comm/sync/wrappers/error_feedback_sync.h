// Error feedback for every compressing method (docs/architecture.md section 4), in one place: a
// compressor (oktopk, topka, gaussiank, gtopk, powersgd) derives from ErrorFeedbackSync and
// implements compress(), which receives the step's ErrorFeedback::Step (error_feedback.h) and no
// residual of its own. The base owns the residual, builds the step around the gradient, checks
// that acc = grad + residual was formed, and saves and loads the residual after the compressor's
// own state. A new compressor implements compress(), save_state() and load_state(): it forms acc
// (fused into its own pass, or materialized), exchanges, writes the output into the gradient and
// reports what it contributed; the residual follows.
//
// Why a base class rather than a wrapper object around a separate compressor: the compressors'
// own accessors (k, thresholds, region bounds, PowerSGD's factors) are read by the tests and the
// benchmark on the same object that runs the steps, and the step handle already keeps the
// compressor from touching the residual in any other way. The dense warmup stays a wrapper
// (gradient_sync.cpp) around the whole method.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/sync/wrappers/accordion.h"
#include "comm/sync/wrappers/dgc.h"
#include "comm/sync/wrappers/error_feedback.h"
#include "comm/sync/gradient_sync.h"

namespace trainer::comm {

// The detector's options from the compressors' keys: sync.<method>.adaptive_interval, or an epoch
// (o.recipe.steps_per_epoch) when it is 0; an interval of 0 when neither is known (Accordion::add refuses).
AccordionOptions adaptive_options(const SyncOptions& o);

// The compressing methods' start note about a short dense warmup (or none) before compression, for
// their specs' start_notes; empty when the recipe is not one that measured a loss.
std::vector<std::string> short_warmup_notes(const SyncOptions& options);

// The sparse methods' start note about a run too short for error feedback: an entry left out waits
// about 1/density steps, so the compressed steps last (steps x density) such delays; below 20, every
// gap measured at density 0.01 was 3 points or more. Empty when the run is longer or its length unknown.
std::vector<std::string> short_horizon_notes(const SyncOptions& options, double density);

class ErrorFeedbackSync : public GradientSync {
 public:
  Phase phase(int64_t) const final { return Phase::kCompressed; }
  SyncStats reduce(SyncBuffers& b, int64_t step) final;
  // sync.<method>.dgc: the momentum on the dense warmup's averaged gradient (dgc.h).
  void dense_warmup_step(SyncBuffers& b) final;
  // The compressor's state, then the residual (ErrorFeedback::save), then with sync.<method>.dgc or a
  // sparsity warm-up a "dgc" section: the density in use and the velocity (none: saved without both).
  void save(std::ostream& out) const final;
  // All or nothing: on an error the compressor's state and the residual stay as they were.
  void load(std::istream& in) final;
  // Elastic resume: the compressor's state by merge_state, the residual the mean of the saved ranks'
  // (ErrorFeedback::load_mean). All or nothing, as load().
  std::string load_resharded(const std::vector<std::string>& states) final;
  std::string overlap_plan() const override {
    return "none (" + name() + " selects over the whole gradient, so it starts after backward)";
  }

  // false: the ablation without error feedback (sync.<method>.error_feedback): each step still forms
  // acc = grad + residual, but the residual is cleared after it, so it is always zero: what was not
  // sent is dropped. The residual stays in the checkpoint format (zeros).
  void set_keep_residual(bool keep) { keep_residual_ = keep; }

  ErrorFeedback& error_feedback() { return ef_; }
  const ErrorFeedback& error_feedback() const { return ef_; }

  // sync.<method>.adaptive (accordion.h): from here on the compressor runs at `low` (sync.powersgd.adaptive_rank or
  // sync.<method>.adaptive_density) for the groups in a critical regime and at `high` (sync.powersgd.rank,
  // sync.<method>.density) for the others, starting at `low`. reduce() adds each output to the detector;
  // a switch takes effect from the next step and is logged as an ADAPTIVE_SWITCH record (no
  // bytes) in the comm log of `comm`. The detector's state is saved ahead of the compressor's (a
  // state without it loads only with sync.<method>.adaptive off, and the other way round).
  void enable_adaptive(Communicator& comm, std::vector<AccordionGroup> groups, const AccordionOptions& options,
                       double high, double low);
  const Accordion* accordion() const { return accordion_.get(); }

  // sync.<method>.dgc (dgc.h): momentum correction, momentum factor masking and local clipping around every
  // step, the velocity where the residual lives.
  void enable_dgc(const DgcSettings& settings);
  const DgcMomentum* dgc() const { return dgc_.get(); }
  // sync.<method>.density_warmup_* (dgc.h DensityWarmup): each step first sets the compressor's density to
  // the warm-up's for that step, through adapt() as sync.<method>.adaptive does (refused together with it).
  void enable_density_warmup(const DensityWarmup& warmup);
  // For describe(): "" without DGC or a warm-up, else a line each.
  std::string dgc_note() const;
  // The setting a group at low (true) or high compression uses.
  double adaptive_setting(bool low) const { return low ? low_setting_ : high_setting_; }
  // For describe(): "" without sync.<method>.adaptive, else a line naming the two settings of `what`.
  std::string adaptive_note(const char* what) const;

 protected:
  // `device`: where the residual lives (error_feedback.h); null: host memory.
  explicit ErrorFeedbackSync(int64_t n, models::Backend* device = nullptr) : ef_(n, device) {}
  // One compressed step: on return b.grads holds the output (the same on every rank).
  virtual SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) = 0;
  // The compressor's versioned state (write_sync_header first); load_state throws
  // std::runtime_error naming what does not match.
  virtual void save_state(std::ostream& out) const = 0;
  virtual void load_state(std::istream& in) = 0;
  // Elastic resume: reads the compressor's part of every saved rank's state (leaving each stream at
  // its residual) and takes the merged state; returns what it did, in a few words. The default is
  // for state every rank keeps equal (counters, PowerSGD's Q): each part is loaded in turn and
  // must save back to rank 0's bytes. A method with a rank's own state (thresholds) overrides it.
  virtual std::string merge_state(const std::vector<std::istream*>& saved);
  // sync.<method>.adaptive: group g now runs at adaptive_setting(low[g]). `fresh`: the switch happens now,
  // between two steps (a compressor may re-derive what depends on the setting at its next step);
  // false when a loaded state sets it (the compressor's own state, loaded next, follows).
  virtual void adapt(const std::vector<uint8_t>& low, bool fresh) {}

 private:
  void save_adaptive(std::ostream& out) const;
  void save_dgc(std::ostream& out) const;
  // The "dgc" section: its density applied (adapt, not fresh), the velocity loaded; nothing when
  // neither is on. `saved` holds every saved rank's stream (one for an exact resume): the velocity
  // is their mean. Throws when the section's presence differs from this run's settings.
  void load_dgc(const std::vector<std::istream*>& saved);
  // The warm-up's density for `step` applied when it differs from the one in use (a fresh switch).
  void apply_density(double density, bool fresh);
  void load_adaptive(std::istream& in);  // the detector's state, or none; applies the settings

  ErrorFeedback ef_;
  bool keep_residual_ = true;
  std::unique_ptr<Accordion> accordion_;  // null unless sync.<method>.adaptive
  Communicator* comm_for_log_ = nullptr;
  double high_setting_ = 0, low_setting_ = 0;
  std::unique_ptr<DgcMomentum> dgc_;  // null unless sync.<method>.dgc
  DensityWarmup warmup_;              // off unless sync.<method>.density_warmup_*
};

}  // namespace trainer::comm
