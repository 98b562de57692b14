#include "comm/sync/dgc.h"

#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>

#include "comm/sync/rank_mean.h"
#include "comm/sync/sync_state.h"
#include "optim/clip.h"

namespace trainer::comm {

double DensityWarmup::density_at(int64_t step) const {
  if (!on() || step >= steps || step < 0) return target;
  const int64_t stage = step * stages / steps;
  return start * std::pow(target / start, static_cast<double>(stage) / static_cast<double>(stages));
}

DgcMomentum::DgcMomentum(int64_t n, models::Backend& backend, const DgcSettings& settings)
    : n_(n), backend_(backend), on_host_(backend.is_host()), settings_(settings) {
  if (!on_host_) on_device_ = models::DeviceBuffer(backend);
}

float* DgcMomentum::storage() {
  if (on_host_) {
    if (host_.empty()) host_.assign(n_, 0.f);
    return host_.data();
  }
  if (on_device_.empty()) {
    on_device_.resize(n_);
    backend_.fill(n_, 0.f, on_device_.data());
  }
  return on_device_.data();
}

float* DgcMomentum::device_velocity() {
  if (on_host_) throw std::logic_error("dgc: device_velocity() on a velocity in host memory");
  return storage();
}

void DgcMomentum::update(float* grad, double clip_at) {
  if (clip_at > 0) optim::clip_grad_norm(backend_, grad, n_, clip_at);
  backend_.momentum_correction(n_, static_cast<float>(settings_.momentum), settings_.nesterov, storage(), grad);
}

void DgcMomentum::correct_local(float* grad) {
  update(grad, settings_.clip_norm > 0 ? settings_.clip_norm / std::sqrt(static_cast<double>(settings_.ranks)) : 0);
}

void DgcMomentum::correct_averaged(float* grad) { update(grad, settings_.clip_norm); }

void DgcMomentum::mask(const ErrorFeedback& ef) {
  if (!on_host_) return;  // the device passes cleared u with the residual
  const uint16_t* sent = ef.pending_clears();
  if (!sent || host_.empty()) return;
  float* u = host_.data();
  const int64_t words = (n_ + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int64_t w = 0; w < words; ++w) {
    if (!sent[w]) continue;
    for (int j = 0; j < 16; ++j)
      if (sent[w] >> j & 1u) u[16 * w + j] = 0.f;
  }
}

std::vector<float> DgcMomentum::values() const {
  if (on_host_) return host_;
  return on_device_.empty() ? std::vector<float>{} : models::host_copy(on_device_, n_);
}

void DgcMomentum::save(std::ostream& out) const {
  const std::vector<float> u = values();
  write_pod(out, n_);
  write_pod(out, static_cast<uint8_t>(!u.empty()));
  if (!u.empty()) out.write(reinterpret_cast<const char*>(u.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
}

void DgcMomentum::adopt(std::vector<float> u) {
  if (on_host_) {
    host_ = std::move(u);
    return;
  }
  if (u.empty()) {
    on_device_ = models::DeviceBuffer(backend_);
    return;
  }
  on_device_.resize(n_);
  models::copy_to_device(backend_, u.data(), n_, on_device_.data());
}

namespace {
// One rank's saved velocity: empty when it had none yet.
std::vector<float> read_velocity(std::istream& in, int64_t n, const std::string& where) {
  const auto saved_n = read_pod<int64_t>(in);
  const auto present = read_pod<uint8_t>(in);
  if (!in) throw std::runtime_error(where + ": truncated before the velocity");
  if (saved_n != n)
    throw std::runtime_error(where + " holds a velocity of " + std::to_string(saved_n) + " entries, this model has " +
                             std::to_string(n));
  std::vector<float> u;
  if (!present) return u;
  u.resize(n);
  in.read(reinterpret_cast<char*>(u.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!in) throw std::runtime_error(where + ": velocity truncated");
  return u;
}
}  // namespace

void DgcMomentum::load(std::istream& in) { adopt(read_velocity(in, n_, "sync.dgc state")); }

void DgcMomentum::load_mean(const std::vector<std::istream*>& saved) {
  RankMean sum(n_);
  for (size_t r = 0; r < saved.size(); ++r) {
    const std::vector<float> u = read_velocity(*saved[r], n_, "sync.dgc state of saved rank " + std::to_string(r));
    if (!u.empty()) sum.add(u.data());
  }
  if (sum.ranks() != 0 && sum.ranks() != static_cast<int>(saved.size()))
    throw std::runtime_error("sync.dgc: " + std::to_string(sum.ranks()) + " of " + std::to_string(saved.size()) +
                             " saved ranks hold a velocity (ranks in different phases)");
  adopt(sum.ranks() == 0 ? std::vector<float>{} : sum.mean());
}

}  // namespace trainer::comm
