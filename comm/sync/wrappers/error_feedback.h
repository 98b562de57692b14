// Error feedback's residual (docs/architecture.md section 4), and the one way a compressor touches
// it during a step (ErrorFeedback::Step). Every compressing method (error_feedback_sync.h) keeps, per
// rank and per gradient entry, what it has not yet contributed to an output, BytePS style:
//   acc = grad + residual;  c = compress(acc);  residual = acc - decompress(c)
// where decompress(c) is, per entry, what this rank counts as sent: acc itself for an entry a
// sparse method contributed whole (residual 0), an approximation for a dense compressor
// (PowerSGD: residual = acc - P Q^T), nothing for an entry not sent (residual = acc).
//
// acc is formed in the residual buffer itself, and where a compressor streams the gradient anyway
// (the sparse selection pass) inside that pass, so error feedback costs no pass of its own.
// Clears are deferred: they only set a bit per entry (a 3.4 MB bitmap for the paper's 27.5M
// entries, cache-friendly), and the next selection pass applies them while it streams through the
// residual anyway, instead of scattered writes into the 110 MB residual now. residual(), values()
// and save() see the true residual (pending clears applied).
//
// The buffer is allocated (zero) on first use, so the dense warmup holds no residual and
// compression starts from zeros. Saved as a count, a presence byte and the raw n floats.
//
// On a device (a backend whose memory is not the host's: runtime.device = "cuda") the residual is a
// DeviceBuffer of that backend: the sparse methods' device passes (sparse_passes.h, through
// Step::on_device) apply their clears there at once (scattered writes cost a GPU little), so nothing
// is deferred; a dense compressor's materialize, adopt and sent_approximately run as backend ops. Saving and loading copy through the host: the checkpoint is the same file
// on either device, and a run resumes on the other.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <istream>
#include <vector>

#include "comm/sync/methods/sparse/select.h"
#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::comm {

class ErrorFeedback {
 public:
  // `device`: where the residual lives; null (or a host backend): host memory.
  explicit ErrorFeedback(int64_t n, models::Backend* device = nullptr)
      : n_(n), device_(device && !device->is_host() ? device : nullptr) {
    if (device_) on_device_ = models::DeviceBuffer(*device_);
  }
  int64_t size() const { return n_; }
  bool allocated() const { return device_ ? !on_device_.empty() : !residual_.empty(); }
  // The device the residual lives on, or null (host memory).
  models::Backend* device() const { return device_; }
  // The residual, pending clears applied (zero-filled on the first call).
  float* residual();
  // The same wherever it lives: host memory, or the device's (a dense compressor reads it there
  // before its step forms acc: PowerSGD).
  float* data() { return device_ ? device_storage() : residual(); }
  // The residual as it is stored (empty before the first use), for readers that know no clears are
  // pending (a dense compressor never defers any).
  const std::vector<float>& values() const {
    require_host("values()");
    return residual_;
  }
  // For a selection pass forming acc = grad + residual (select.h's SelectSource): the pass applies
  // and resets the pending clears, so call this right before the pass.
  SelectSource accumulate(const float* grad);
  // Clears the residual at the given indices (what this rank contributed in full); deferred.
  void clear(const int32_t* index, int64_t count);
  // The deferred-clear flags themselves (one bit per entry, 16 per word), for a pass that decides
  // what to clear (write_sparse_output); flags set there are applied like clear()'s.
  uint16_t* clear_flags();
  // The clears deferred since the last selection pass (one bit per entry, 16 per word), or null when
  // none are: after a step, exactly what it sent (DGC's momentum masking reads them, dgc.h).
  const uint16_t* pending_clears() const { return has_pending_ ? pending_.data() : nullptr; }
  // On a device: a second buffer of n floats (DGC's velocity) that the device passes clear wherever
  // they clear the residual; null: none.
  void set_cleared_with(float* companion) { cleared_with_ = companion; }
  float* cleared_with() const { return cleared_with_; }
  // Sets the whole residual to zero (pending clears dropped): what a step leaves behind when the
  // method runs without error feedback (sync.<method>.error_feedback = false).
  void clear_all();

  void save(std::ostream& out) const;
  // Throws std::runtime_error (prefixed with `what`) when the saved size differs or data is short.
  void load(std::istream& in, const char* what);
  // Elastic resume: the residual becomes the mean of the residuals the P ranks of another world
  // size saved (each stream at its residual, as load() reads it). What the average update still
  // owes, sum_r e_r / P, is so kept whatever the new number of ranks: every new rank gets the same
  // bits, the exact mean rounded once to float32 (rank_mean.h states the bound), so the mean over
  // the P' new ranks differs from the mean over the P old ones by that one rounding. Saved without
  // a residual (the dense warmup) on every rank: none.
  void load_mean(const std::vector<std::istream*>& saved, const char* what);

  // One compressed step's access to the residual, in the order error feedback needs, for one
  // compressor (ErrorFeedbackSync builds it around the step's gradient and checks the order):
  // first acc = grad + residual is formed, once, in one of three ways
  //   fused()               a select.h source: the compressor's selection pass forms acc into the
  //                         residual while it selects (sparse compressors; no pass of its own)
  //   in_place()            the residual buffer, clears applied, for the compressor's own fused
  //                         pass that writes acc = grad + residual into it (GaussianK's moments)
  //   materialize(at, count)  acc formed now over [at, at + count) and returned (dense
  //                         compressors; one call per range, any number of ranges)
  //   adopt(at, acc, count)  acc that the compressor formed earlier outside the residual, as
  //                         grad + the residual before the step in materialize's rounding, is stored
  //                         as this step's acc over [at, at + count) (PowerSGD's buckets form acc in
  //                         the gradient during backward, while the step may still be skipped and
  //                         the residual must not change yet); mixes with materialize's ranges
  // then what this rank contributed is reported (any number of reports, any mix)
  //   sent(index, count)    those entries went out whole: residual 0 there (deferred clears)
  //   sent_flags()          the same as flags a pass sets (write_sparse_output's `clear`)
  //   sent_approximately(at, approx, count)  [at, at + count) went out as approx:
  //                         residual = acc - approx
  // Entries not reported keep acc. Entries never formed keep their residual: a compressor may send
  // some entries exactly without forming acc (PowerSGD's dense tensors), their residual stays 0.
  // Calls out of this order throw std::logic_error.
  class Step {
   public:
    Step(ErrorFeedback& ef, const float* grad) : ef_(ef), grad_(grad) {}
    SelectSource fused();
    float* in_place();
    // The device residual itself (zero-filled on the first call) for the device passes, which form
    // acc in it and apply the step's clears there (ErrorFeedback on a device only).
    float* on_device();
    float* materialize(int64_t at, int64_t count);
    float* adopt(int64_t at, const float* acc, int64_t count);
    void sent(const int32_t* index, int64_t count);
    uint16_t* sent_flags();
    void sent_approximately(int64_t at, const float* approx, int64_t count);
    bool formed() const { return state_ != State::kFresh; }
    // ErrorFeedback::cleared_with(): the device passes clear it where they clear the residual.
    float* cleared_with() const { return ef_.cleared_with(); }

   private:
    enum class State { kFresh, kWhole, kRanges };
    void require_formed(const char* call) const;

    ErrorFeedback& ef_;
    const float* grad_;
    State state_ = State::kFresh;
  };

 private:
  float* storage();  // allocated, pending clears not applied
  float* device_storage();  // allocated (zero) on the device
  void require_host(const char* call) const;
  // The residual as read back from the device (empty when none is allocated).
  std::vector<float> device_values() const;
  // A loaded residual (load, load_mean) becomes this one, on the device where it lives.
  void adopt_loaded(std::vector<float> r);

  int64_t n_;
  models::Backend* device_ = nullptr;
  models::DeviceBuffer on_device_;
  std::vector<float> residual_;
  std::vector<uint16_t> pending_;  // one bit per entry; all zero when has_pending_ is false
  bool has_pending_ = false;
  float* cleared_with_ = nullptr;
};

}  // namespace trainer::comm
