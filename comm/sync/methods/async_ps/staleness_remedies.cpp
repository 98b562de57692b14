#include "comm/sync/methods/async_ps/staleness_remedies.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "comm/sync/sync_state.h"

namespace trainer::comm {

double corrected_momentum(double momentum, int workers) {
  return std::max(0.0, momentum - (1.0 - 1.0 / static_cast<double>(workers)));
}

void GapAwareDamping::damp(float* grad, const float* w_now, const float* w_pulled, float weight_decay) const {
  if (updates_ == 0 || max_lr_ <= 0) return;
  const int64_t n = static_cast<int64_t>(mean_square_.size());
  const float* ms = mean_square_.data();
  const float bias = static_cast<float>(1.0 - std::pow(kDecay, static_cast<double>(updates_)));
  const float max_lr = static_cast<float>(max_lr_), eps = static_cast<float>(kEpsilon);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float c = max_lr * (std::sqrt(ms[i] / bias) + eps);  // one average update of element i
    const float inv = 1.f / (1.f + std::fabs(w_now[i] - w_pulled[i]) / c);
    grad[i] = grad[i] * inv + weight_decay * w_now[i] * (inv - 1.f);
  }
}

void GapAwareDamping::observe(const float* before, const float* after, double lr) {
  if (lr <= 0) return;  // no direction to learn from a zero-lr step (the warmup's first)
  const int64_t n = static_cast<int64_t>(mean_square_.size());
  float* ms = mean_square_.data();
  const float inv_lr = static_cast<float>(1.0 / lr), keep = static_cast<float>(kDecay);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float u = (before[i] - after[i]) * inv_lr;
    ms[i] = keep * ms[i] + (1.f - keep) * u * u;
  }
  ++updates_;
  max_lr_ = std::max(max_lr_, lr);
}

void GapAwareDamping::save(std::ostream& out) const {
  write_pod(out, static_cast<int64_t>(mean_square_.size()));
  write_pod(out, updates_);
  write_pod(out, max_lr_);
  out.write(reinterpret_cast<const char*>(mean_square_.data()),
            static_cast<std::streamsize>(mean_square_.size() * sizeof(float)));
}

void GapAwareDamping::load(std::istream& in) {
  GapAwareDamping saved = read(in);
  if (saved.mean_square_.size() != mean_square_.size())
    throw std::runtime_error("async_ps gap-aware state: " + std::to_string(saved.mean_square_.size()) +
                             " elements, this shard has " + std::to_string(mean_square_.size()));
  *this = std::move(saved);
}

GapAwareDamping GapAwareDamping::read(std::istream& in) {
  const auto n = read_pod<int64_t>(in);
  if (!in || n < 0 || n > (int64_t{1} << 40)) throw std::runtime_error("async_ps gap-aware state: truncated");
  GapAwareDamping g(0);
  g.updates_ = read_pod<int64_t>(in);
  g.max_lr_ = read_pod<double>(in);
  g.mean_square_.resize(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(g.mean_square_.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!in) throw std::runtime_error("async_ps gap-aware state: truncated");
  return g;
}

GapAwareDamping GapAwareDamping::slice(int64_t begin, int64_t end) const {
  GapAwareDamping g(0);
  g.mean_square_.assign(mean_square_.begin() + begin, mean_square_.begin() + end);
  g.updates_ = updates_;
  g.max_lr_ = max_lr_;
  return g;
}

GapAwareDamping GapAwareDamping::join(const std::vector<GapAwareDamping>& parts) {
  GapAwareDamping g(0);
  for (size_t s = 0; s < parts.size(); ++s) {
    const GapAwareDamping& p = parts[s];
    if (s > 0 && (p.updates_ != g.updates_ || p.max_lr_ != g.max_lr_))
      throw std::runtime_error("async_ps gap-aware state of server " + std::to_string(s) + " has seen " +
                               std::to_string(p.updates_) + " updates, server 0's " + std::to_string(g.updates_) +
                               " (or another largest lr)");
    g.updates_ = p.updates_;
    g.max_lr_ = p.max_lr_;
    g.mean_square_.insert(g.mean_square_.end(), p.mean_square_.begin(), p.mean_square_.end());
  }
  return g;
}

}  // namespace trainer::comm
