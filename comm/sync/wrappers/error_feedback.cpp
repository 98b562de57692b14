#include "comm/sync/wrappers/error_feedback.h"

#include <algorithm>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include "comm/sync/codecs/rank_mean.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

void ErrorFeedback::require_host(const char* call) const {
  if (device_)
    throw std::logic_error(std::string("error feedback: ") + call + " on a residual in device memory (" +
                           device_->name() + "): only the device passes touch it");
}

float* ErrorFeedback::device_storage() {
  if (on_device_.empty()) {
    on_device_.resize(n_);
    device_->fill(n_, 0.f, on_device_.data());
  }
  return on_device_.data();
}

std::vector<float> ErrorFeedback::device_values() const {
  return on_device_.empty() ? std::vector<float>{} : models::host_copy(on_device_, n_);
}

float* ErrorFeedback::storage() {
  require_host("the host residual");
  if (residual_.empty()) {
    residual_.assign(n_, 0.f);
    pending_.assign((n_ + 15) / 16, 0);
  }
  return residual_.data();
}

float* ErrorFeedback::residual() {
  float* r = storage();
  if (has_pending_) {
    for (int64_t w = 0; w < static_cast<int64_t>(pending_.size()); ++w) {
      if (!pending_[w]) continue;
      for (int j = 0; j < 16; ++j)
        if (pending_[w] >> j & 1u) r[16 * w + j] = 0.f;
      pending_[w] = 0;
    }
    has_pending_ = false;
  }
  return r;
}

void ErrorFeedback::clear_all() {
  if (!allocated()) return;
  if (device_) {
    device_->fill(n_, 0.f, on_device_.data());
    return;
  }
  std::fill(residual_.begin(), residual_.end(), 0.f);
  if (has_pending_) std::fill(pending_.begin(), pending_.end(), uint16_t{0});
  has_pending_ = false;
}

SelectSource ErrorFeedback::accumulate(const float* grad) {
  float* r = storage();
  SelectSource source{grad, r, has_pending_ ? pending_.data() : nullptr};
  has_pending_ = false;  // the pass resets every flag it applies
  return source;
}

void ErrorFeedback::clear(const int32_t* index, int64_t count) {
  storage();
  for (int64_t j = 0; j < count; ++j) set_flag(pending_.data(), index[j]);
  has_pending_ = has_pending_ || count > 0;
}

uint16_t* ErrorFeedback::clear_flags() {
  storage();
  has_pending_ = true;
  return pending_.data();
}

void ErrorFeedback::save(std::ostream& out) const {
  write_pod(out, n_);
  write_pod(out, static_cast<uint8_t>(allocated()));
  if (!allocated()) return;
  if (device_) {
    const std::vector<float> host = device_values();
    out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
    return;
  }
  if (!has_pending_) {
    out.write(reinterpret_cast<const char*>(residual_.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
    return;
  }
  // Pending clears applied on the way out, a chunk at a time (save is const).
  constexpr int64_t kChunk = int64_t{1} << 20;  // a multiple of 16
  std::vector<float> chunk(std::min(n_, kChunk));
  for (int64_t begin = 0; begin < n_; begin += kChunk) {
    const int64_t count = std::min(kChunk, n_ - begin);
    std::memcpy(chunk.data(), residual_.data() + begin, count * sizeof(float));
    for (int64_t i = 0; i < count; ++i)
      if (pending_[(begin + i) >> 4] >> ((begin + i) & 15) & 1u) chunk[i] = 0.f;
    out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(count * sizeof(float)));
  }
}

void ErrorFeedback::load(std::istream& in, const char* what) {
  const auto n = read_pod<int64_t>(in);
  const auto present = read_pod<uint8_t>(in);
  if (!in) throw std::runtime_error(std::string(what) + " state: truncated before the residual");
  if (n != n_)
    throw std::runtime_error(std::string(what) + " state holds a residual of " + std::to_string(n) +
                             " entries, this model has " + std::to_string(n_));
  if (!present) {
    residual_.clear();
    residual_.shrink_to_fit();
    pending_.clear();
    has_pending_ = false;
    if (device_) on_device_ = models::DeviceBuffer(*device_);
    return;
  }
  std::vector<float> r(n_);
  in.read(reinterpret_cast<char*>(r.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
  if (!in) throw std::runtime_error(std::string(what) + " state: residual truncated");
  adopt_loaded(std::move(r));
}

void ErrorFeedback::adopt_loaded(std::vector<float> r) {
  pending_.clear();
  has_pending_ = false;
  if (device_) {
    on_device_.resize(n_);
    models::copy_to_device(*device_, r.data(), n_, on_device_.data());
    residual_.clear();
    residual_.shrink_to_fit();
    return;
  }
  residual_ = std::move(r);
  pending_.assign((n_ + 15) / 16, 0);
}

void ErrorFeedback::load_mean(const std::vector<std::istream*>& saved, const char* what) {
  const std::string where(what);
  RankMean sum(n_);
  int present = 0;
  for (size_t r = 0; r < saved.size(); ++r) {
    std::istream& in = *saved[r];
    const auto n = read_pod<int64_t>(in);
    const auto has = read_pod<uint8_t>(in);
    if (!in) throw std::runtime_error(where + " state of saved rank " + std::to_string(r) + ": truncated before the residual");
    if (n != n_)
      throw std::runtime_error(where + " state of saved rank " + std::to_string(r) + " holds a residual of " +
                               std::to_string(n) + " entries, this model has " + std::to_string(n_));
    if (!has) continue;
    ++present;
    std::vector<float> r32(n_);
    in.read(reinterpret_cast<char*>(r32.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
    if (!in) throw std::runtime_error(where + " state of saved rank " + std::to_string(r) + ": residual truncated");
    sum.add(r32.data());
  }
  if (present != 0 && present != static_cast<int>(saved.size()))
    throw std::runtime_error(where + ": " + std::to_string(present) + " of " + std::to_string(saved.size()) +
                             " saved ranks hold a residual (ranks in different phases)");
  residual_.clear();
  pending_.clear();
  has_pending_ = false;
  if (present == 0) {
    residual_.shrink_to_fit();
    if (device_) on_device_ = models::DeviceBuffer(*device_);
    return;
  }
  adopt_loaded(sum.mean());
}

void ErrorFeedback::Step::require_formed(const char* call) const {
  if (state_ == State::kFresh)
    throw std::logic_error(std::string("error feedback: ") + call + " before acc = grad + residual was formed");
}

SelectSource ErrorFeedback::Step::fused() {
  if (state_ != State::kFresh) throw std::logic_error("error feedback: acc = grad + residual formed twice in a step");
  state_ = State::kWhole;
  return ef_.accumulate(grad_);
}

float* ErrorFeedback::Step::on_device() {
  if (!ef_.device_) throw std::logic_error("error feedback: a device pass on a residual in host memory");
  if (state_ != State::kFresh) throw std::logic_error("error feedback: acc = grad + residual formed twice in a step");
  state_ = State::kWhole;
  return ef_.device_storage();
}

float* ErrorFeedback::Step::in_place() {
  if (state_ != State::kFresh) throw std::logic_error("error feedback: acc = grad + residual formed twice in a step");
  state_ = State::kWhole;
  return ef_.residual();
}

float* ErrorFeedback::Step::materialize(int64_t at, int64_t count) {
  if (state_ == State::kWhole) throw std::logic_error("error feedback: acc = grad + residual formed twice in a step");
  if (at < 0 || count < 0 || at + count > ef_.size()) throw std::logic_error("error feedback: range outside the gradient");
  state_ = State::kRanges;
  const float* grad = grad_ + at;
  if (ef_.device_) {
    float* acc = ef_.device_storage() + at;
    ef_.device_->add(count, acc, grad, acc);
    return acc;
  }
  float* acc = ef_.residual() + at;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) acc[i] += grad[i];
  return acc;
}

float* ErrorFeedback::Step::adopt(int64_t at, const float* acc, int64_t count) {
  if (state_ == State::kWhole) throw std::logic_error("error feedback: acc = grad + residual formed twice in a step");
  if (at < 0 || count < 0 || at + count > ef_.size()) throw std::logic_error("error feedback: range outside the gradient");
  state_ = State::kRanges;
  if (ef_.device_) {
    float* stored = ef_.device_storage() + at;
    ef_.device_->copy(count, acc, stored);
    return stored;
  }
  float* stored = ef_.residual() + at;
  std::copy(acc, acc + count, stored);
  return stored;
}

void ErrorFeedback::Step::sent(const int32_t* index, int64_t count) {
  require_formed("sent()");
  ef_.clear(index, count);
}

uint16_t* ErrorFeedback::Step::sent_flags() {
  require_formed("sent_flags()");
  return ef_.clear_flags();
}

void ErrorFeedback::Step::sent_approximately(int64_t at, const float* approx, int64_t count) {
  require_formed("sent_approximately()");
  if (at < 0 || count < 0 || at + count > ef_.size()) throw std::logic_error("error feedback: range outside the gradient");
  if (ef_.device_) {
    float* e = ef_.device_storage() + at;
    ef_.device_->subtract(count, e, approx, e);
    return;
  }
  float* e = ef_.residual() + at;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) e[i] -= approx[i];
}

}  // namespace trainer::comm
