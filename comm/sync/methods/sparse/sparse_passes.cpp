#include "comm/sync/methods/sparse/sparse_passes.h"

#include <algorithm>
#include <cmath>

namespace trainer::comm {

namespace {

// The host passes: select.h's on the host residual, formed by the first selection's fused pass.
class HostSparsePasses final : public SparsePasses {
 public:
  HostSparsePasses(models::Backend& backend, int64_t n) : SparsePasses(n), backend_(backend) {}

  void begin(float* grad, ErrorFeedback::Step& ef) override {
    grad_ = grad;
    ef_ = &ef;
    acc_ = nullptr;
  }
  int64_t select_at_least(float lo, SparseList& out) override {
    return comm::select_at_least(source(), n_, lo, out, scratch_);
  }
  float select_top_k(int64_t k, bool exactly_k, SparseList& out) override {
    return comm::select_top_k(source(), n_, k, exactly_k, out, scratch_);
  }
  int64_t write_output(const std::vector<ListRef>& runs, float divisor, const SparseList* mine) override {
    if (!mine) {
      write_sparse_output(grad_, n_, runs, divisor, output_);
      return 0;
    }
    mine_.resize((n_ + 15) / 16);  // zero between steps: the output pass resets what it reads
    for (int64_t j = 0; j < mine->size(); ++j) set_flag(mine_.data(), mine->index()[j]);
    return write_sparse_output(grad_, n_, runs, divisor, output_, mine_.data(), ef_->sent_flags());
  }
  void sent(const int32_t* index, int64_t count) override { ef_->sent(index, count); }

 private:
  // The step's first selection forms acc in its own pass (the fused source); later ones read it.
  SelectSource source() {
    if (acc_) return read_only(acc_);
    const SelectSource fused = ef_->fused();
    acc_ = fused.residual;
    return fused;
  }
  void accumulate_moments(double* sums) override {
    acc_ = ef_->in_place();
    backend_.accumulate_moments(n_, grad_, acc_, sums);
  }

  models::Backend& backend_;
  float* grad_ = nullptr;
  ErrorFeedback::Step* ef_ = nullptr;
  float* acc_ = nullptr;
  SelectScratch scratch_;
  OutputScratch output_;
  std::vector<uint16_t> mine_;
};

}  // namespace

void SparsePasses::moments(double& mean, double& stddev) {
  double sums[2];
  accumulate_moments(sums);
  mean = sums[0] / n_;
  // Unbiased, as torch.std.
  stddev = n_ > 1 ? std::sqrt(std::max(0.0, (sums[1] - sums[0] * mean) / (n_ - 1))) : 0.0;
}

std::unique_ptr<SparsePasses> make_sparse_passes(models::Backend& backend, int64_t n) {
  if (!backend.is_host()) return make_device_sparse_passes(backend, n);
  return std::make_unique<HostSparsePasses>(backend, n);
}

}  // namespace trainer::comm
