#include "comm/sync/methods/sparse/gaussiank.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/wrappers/keep_dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod gaussiank_method() {
  return sparse_method("gaussiank", "normal-fit threshold, allgatherv",
                       [](const SyncOptions& o, Communicator& comm, int64_t count, models::Backend& backend) {
                         return std::make_unique<GaussianK>(comm, count, options_of<SparseOptions>(o).density, backend);
                       });
}

double normal_two_sided_quantile(double tail) {
  // Solve erfc(z / sqrt 2) = tail by Newton's method on log erfc, which is smooth and nearly
  // linear in z over the range densities use; a dozen steps reach double precision.
  double z = 2.0;
  for (int it = 0; it < 50; ++it) {
    const double f = std::log(std::erfc(z / std::sqrt(2.0))) - std::log(tail);
    const double pdf2 = std::sqrt(2.0 / M_PI) * std::exp(-z * z / 2);  // -d/dz erfc(z / sqrt 2)
    const double step = f / (-pdf2 / std::erfc(z / std::sqrt(2.0)));
    z = std::max(0.0, z - step);
    if (std::fabs(step) < 1e-12) break;
  }
  return z;
}

GaussianK::GaussianK(Communicator& comm, int64_t n, double density, models::Backend& backend)
    : ErrorFeedbackSync(n, &backend),
      comm_(comm),
      n_(n),
      k_(top_k_count(density, n)),
      density_(density),
      passes_(make_sparse_passes(backend, n)) {}

std::string GaussianK::describe() const {
  const int p = comm_.size();
  std::ostringstream out;
  out << "gaussiank: threshold from a normal fit of grad + residual, adjusted until about k = " << k_ << " of " << n_
      << " entries pass; ALLGATHER_COUNTS, ALLGATHERV_FINAL of (index, value); per rank about " << 2 * k_ * 4 / 1e6
      << " MB sent, " << 2.0 * k_ * (p - 1) * 4 / 1e6 << " MB received at P = " << p << "; error feedback";
  out << adaptive_note("density") << dgc_note();
  return out.str();
}

float GaussianK::adjusted_threshold(float t) {
  constexpr float kScale = 1.012f;
  constexpr int kMaxLoops = 50, kCollectBelow = 12;
  auto count_at_least = [&](float x) {
    int64_t c = 0;
    for (int64_t i = 0; i < local_.size(); ++i) c += std::fabs(local_.value()[i]) >= x;
    return c;
  };
  // Collect at a bound kCollectBelow factors under t: the downward loop rarely needs more.
  auto collect_below = [&](float x) {
    float lo = x;
    for (int i = 0; i < kCollectBelow; ++i) lo /= kScale;
    passes_->select_at_least(std::max(lo, min_threshold()), local_);
    return lo;
  };
  float lo = collect_below(t);
  int loops = 0;
  int64_t count = count_at_least(t);
  if (4 * count < 3 * k_) {
    while (4 * count < 3 * k_ && loops < kMaxLoops && t > min_threshold()) {
      t /= kScale;
      ++loops;
      if (t < lo) lo = collect_below(t);
      count = count_at_least(t);
    }
  } else {
    while (4 * count > 5 * k_ && loops < kMaxLoops) {
      t *= kScale;
      ++loops;
      count = count_at_least(t);
    }
  }
  return t;
}

SyncStats GaussianK::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  const int p = comm_.size(), me = comm_.rank();
  passes_->begin(b.grads, ef);
  double mean = 0, stddev = 0;
  passes_->moments(mean, stddev);
  const float fit = static_cast<float>(mean + stddev * normal_two_sided_quantile(std::min(density_, 1.0 - 1e-12)));
  threshold_ = adjusted_threshold(std::max(fit, min_threshold()));
  const int64_t mine = keep_at_least(local_, threshold_);

  counts_.resize(p);
  const auto mine32 = static_cast<int32_t>(mine);
  comm_.allgather(&mine32, 1, counts_.data(), DType::kI32, "ALLGATHER_COUNTS");
  block_counts_.resize(p);
  int64_t total = 0, my_offset = 0;
  for (int r = 0; r < p; ++r) {
    if (r == me) my_offset = total;
    block_counts_[r] = 2 * int64_t{counts_[r]};
    total += block_counts_[r];
  }
  gathered_.resize(total);
  int32_t* block = gathered_.data() + my_offset;
  std::memcpy(block, local_.index(), mine * sizeof(int32_t));
  std::memcpy(block + mine, local_.value(), mine * sizeof(float));
  comm_.allgatherv(block, 2 * mine, gathered_.data(), block_counts_, DType::kI32, "ALLGATHERV_FINAL");

  lists_.clear();
  int64_t at = 0;
  for (int r = 0; r < p; ++r) {
    const int32_t* index = gathered_.data() + at;
    lists_.push_back({index, reinterpret_cast<const float*>(index + counts_[r]), counts_[r]});
    at += block_counts_[r];
  }
  merge_sum_all(lists_, merged_, tmp_);
  lists_.assign(1, {merged_.index(), merged_.value(), merged_.size()});
  passes_->write_output(lists_, static_cast<float>(p), nullptr);
  passes_->sent(local_.index(), mine);
  ++steps_;
  return {Phase::kCompressed, static_cast<double>(mine) / n_};
}

void GaussianK::adapt(const std::vector<uint8_t>& low, bool ) {
  k_ = top_k_count(adaptive_setting(low.at(0) != 0), n_);
  density_ = adaptive_setting(low.at(0) != 0);
}

void GaussianK::save_state(std::ostream& out) const {
  write_sync_header(out, "gaussiank", 1);
  write_pod(out, steps_);
  write_pod(out, threshold_);
}

void GaussianK::load_state(std::istream& in) {
  read_sync_header(in, "gaussiank", 1);
  const auto steps = read_pod<int64_t>(in);
  const auto threshold = read_pod<float>(in);
  if (!in) throw std::runtime_error("gaussiank state: truncated");
  steps_ = steps;
  threshold_ = threshold;
}

std::string GaussianK::merge_state(const std::vector<std::istream*>& saved) {
  // The step counter is every rank's; the threshold a rank's own (fitted to its acc): the mean.
  double threshold_sum = 0;
  int64_t steps = 0;
  for (size_t r = 0; r < saved.size(); ++r) {
    read_sync_header(*saved[r], "gaussiank", 1);
    const auto s = read_pod<int64_t>(*saved[r]);
    const auto t = read_pod<float>(*saved[r]);
    if (!*saved[r]) throw std::runtime_error("gaussiank state of saved rank " + std::to_string(r) + ": truncated");
    if (r > 0 && s != steps) throw std::runtime_error("gaussiank state of saved rank " + std::to_string(r) + " is at another step");
    steps = s;
    threshold_sum += t;
  }
  steps_ = steps;
  threshold_ = static_cast<float>(threshold_sum / static_cast<double>(saved.size()));
  return "threshold: the mean of the saved ranks'";
}

WireVolume GaussianK::wire_volume() const {
  const int p = comm_.size();
  return {2.0 * static_cast<double>(k_) * (p - 1), "2k(P-1)"};
}

}  // namespace trainer::comm
