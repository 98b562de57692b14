#pragma once

#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/methods/sparse/select.h"
#include "comm/sync/methods/sparse/sparse_passes.h"

namespace trainer::comm {

// Gaussian-k (Shi et al. 2019), a baseline of the Ok-Top-k paper: instead of an exact k-th
// magnitude, the threshold comes from a normal fit of acc = grad + residual: with mean mu and
// standard deviation sigma, t = mu + sigma * z where P(|Z| > z) = density for a standard normal Z.
// Real gradients are not normal, so t is then adjusted, as the reference does, by the factor 1.012
// at a time (down while fewer than 3k/4 entries reach it, up while more than 5k/4 do; at most 50
// times each way). The adjustment counts over the entries one selection pass collected at a bound
// a dozen factors below t, so it costs no further passes over the gradient unless t must go lower.
// The selection (|acc| >= t) is exchanged with ALLGATHER_COUNTS (one word) and ALLGATHERV_FINAL
// (index and value blocks of every rank), summed in rank order; grads = sum / P on every rank.
// Everything selected is contributed: the residual keeps acc minus the selection.
// Per rank and step: about 2k words sent, 2k(P-1) received.
class GaussianK final : public ErrorFeedbackSync {
 public:
  // `backend`: where the gradient and the residual live (sparse_passes.h); `comm` moves host memory.
  GaussianK(Communicator& comm, int64_t n, double density, models::Backend& backend);
  std::string name() const override { return "gaussiank"; }
  std::string describe() const override;

  int64_t k() const { return k_; }
  WireVolume wire_volume() const override;
  float last_threshold() const { return threshold_; }

 private:
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  // sync.<method>.adaptive: k from sync.<method>.adaptive_density or sync.<method>.density (one group: the whole gradient).
  void adapt(const std::vector<uint8_t>& low, bool fresh) override;
  std::string merge_state(const std::vector<std::istream*>& saved) override;
  float adjusted_threshold(float t);

  Communicator& comm_;
  int64_t n_, k_;
  double density_;
  int64_t steps_ = 0;
  float threshold_ = 0.f;  // the last step's final threshold (reported, not reused)
  std::unique_ptr<SparsePasses> passes_;
  SparseList local_, merged_, tmp_;
  std::vector<int32_t> counts_;
  std::vector<int64_t> block_counts_;
  std::vector<int32_t> gathered_;  // per rank: [indices][value bits]
  std::vector<ListRef> lists_;
};

// The z with P(|Z| > z) = tail for a standard normal Z (0 < tail < 1).
double normal_two_sided_quantile(double tail);

}  // namespace trainer::comm
