// Error feedback (BytePS style, docs/architecture.md section 4), kept apart from the compressors: a residual
// buffer of n floats holding, per entry, everything this rank has not yet contributed to an
// output. Each compressed step the method forms acc = grad + residual into the residual itself, in
// its selection pass (accumulate() hands that pass what it needs), exchanges, and then clears the
// entries it contributed, which leaves residual = acc - contributed.
//
// Clears are deferred: they only set a bit per entry (a 3.4 MB bitmap for the paper's 27.5M
// entries, cache-friendly), and the next selection pass applies them while it streams through the
// residual anyway, instead of scattered writes into the 110 MB residual now. residual() and save()
// apply pending clears first, so everyone outside the pass sees the true residual.
//
// The buffer is allocated (zero) on first use, so the dense warmup holds no residual and
// compression starts from zeros. Saved as a count and the raw n floats in one stream write.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <vector>

#include "comm/sync/select.h"

namespace trainer::comm {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(int64_t n) : n_(n) {}
  int64_t size() const { return n_; }
  bool allocated() const { return residual_ != nullptr; }
  // The residual, pending clears applied (zero-filled on the first call).
  float* residual();
  // For a selection pass forming acc = grad + residual (select.h's SelectSource): the pass applies
  // and resets the pending clears, so call this right before the pass.
  SelectSource accumulate(const float* grad);
  // Clears the residual at the given indices (what this rank contributed in full); deferred.
  void clear(const int32_t* index, int64_t count);
  // The deferred-clear flags themselves (one bit per entry, 16 per word), for a pass that decides
  // what to clear (write_sparse_output); flags set there are applied like clear()'s.
  uint16_t* clear_flags();

  void save(std::ostream& out) const;
  // Throws std::runtime_error (prefixed with `what`) when the saved size differs or data is short.
  void load(std::istream& in, const char* what);

 private:
  float* storage();  // allocated, pending clears not applied

  int64_t n_;
  std::unique_ptr<float[]> residual_;
  std::vector<uint16_t> pending_;  // one bit per entry; all zero when has_pending_ is false
  bool has_pending_ = false;
};

}  // namespace trainer::comm
