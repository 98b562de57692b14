#include "comm/sync/wrappers/dgc.h"

#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>

#include "comm/sync/codecs/rank_mean.h"
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
  if (!on_host_)
    for (Buffer* b : {&velocity_, &decay_, &scratch_}) b->device = models::DeviceBuffer(backend);
}

float* DgcMomentum::storage(Buffer& b) {
  if (on_host_) {
    if (b.host.empty()) b.host.assign(n_, 0.f);
    return b.host.data();
  }
  if (b.device.empty()) {
    b.device.resize(n_);
    backend_.fill(n_, 0.f, b.device.data());
  }
  return b.device.data();
}

std::vector<float> DgcMomentum::read(const Buffer& b) const {
  if (on_host_) return b.host;
  return b.device.empty() ? std::vector<float>{} : models::host_copy(b.device, n_);
}

void DgcMomentum::adopt(Buffer& b, std::vector<float> values) {
  if (on_host_) {
    b.host = std::move(values);
    return;
  }
  if (values.empty()) {
    b.device = models::DeviceBuffer(backend_);
    return;
  }
  b.device.resize(n_);
  models::copy_to_device(backend_, values.data(), n_, b.device.data());
}

float* DgcMomentum::device_velocity() {
  if (on_host_) throw std::logic_error("dgc: device_velocity() on a velocity in host memory");
  return storage(velocity_);
}

void DgcMomentum::update(float* grad, double clip_at) {
  if (clip_at > 0) optim::clip_grad_norm(backend_, grad, n_, clip_at);
  backend_.momentum_correction(n_, static_cast<float>(settings_.momentum), settings_.nesterov, storage(velocity_),
                               grad);
}

void DgcMomentum::correct_local(float* grad) {
  update(grad, settings_.clip_norm > 0 ? settings_.clip_norm / std::sqrt(static_cast<double>(settings_.ranks)) : 0);
}

void DgcMomentum::correct_averaged(float* grad) { update(grad, settings_.clip_norm); }

void DgcMomentum::add_decay(float* output, const float* params) {
  if (settings_.weight_decay <= 0) return;
  if (!params) throw std::logic_error("dgc: weight decay without the parameters");
  float* d = storage(scratch_);
  backend_.copy(n_, params, d);
  backend_.scale(n_, static_cast<float>(settings_.weight_decay), d);  // lambda p
  backend_.momentum_correction(n_, static_cast<float>(settings_.momentum), settings_.nesterov, storage(decay_), d);
  backend_.add(n_, output, d, output);
}

void DgcMomentum::mask(const ErrorFeedback& ef) {
  if (!on_host_) return;  // the device passes cleared u with the residual
  const uint16_t* sent = ef.pending_clears();
  if (!sent || velocity_.host.empty()) return;
  float* u = velocity_.host.data();
  const int64_t words = (n_ + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int64_t w = 0; w < words; ++w) {
    if (!sent[w]) continue;
    for (int j = 0; j < 16; ++j)
      if (sent[w] >> j & 1u) u[16 * w + j] = 0.f;
  }
}

std::vector<float> DgcMomentum::values() const { return read(velocity_); }
std::vector<float> DgcMomentum::decay_values() const { return read(decay_); }

namespace {
void write_velocity(std::ostream& out, int64_t n, const std::vector<float>& u) {
  write_pod(out, n);
  write_pod(out, static_cast<uint8_t>(!u.empty()));
  if (!u.empty()) out.write(reinterpret_cast<const char*>(u.data()), static_cast<std::streamsize>(n * sizeof(float)));
}
}  // namespace

void DgcMomentum::save(std::ostream& out) const {
  write_velocity(out, n_, values());
  write_velocity(out, n_, decay_values());
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

void DgcMomentum::load(std::istream& in) {
  std::vector<float> u = read_velocity(in, n_, "dgc state");
  std::vector<float> w = read_velocity(in, n_, "dgc state (weight decay)");
  adopt(velocity_, std::move(u));
  adopt(decay_, std::move(w));
}

void DgcMomentum::load_mean(const std::vector<std::istream*>& saved) {
  RankMean sum(n_);
  std::vector<float> w;
  for (size_t r = 0; r < saved.size(); ++r) {
    const std::string where = "dgc state of saved rank " + std::to_string(r);
    const std::vector<float> u = read_velocity(*saved[r], n_, where);
    if (!u.empty()) sum.add(u.data());
    std::vector<float> decay = read_velocity(*saved[r], n_, where + " (weight decay)");
    if (r == 0) w = std::move(decay);
  }
  if (sum.ranks() != 0 && sum.ranks() != static_cast<int>(saved.size()))
    throw std::runtime_error("dgc: " + std::to_string(sum.ranks()) + " of " + std::to_string(saved.size()) +
                             " saved ranks hold a velocity (ranks in different phases)");
  adopt(velocity_, sum.ranks() == 0 ? std::vector<float>{} : sum.mean());
  adopt(decay_, std::move(w));
}

}  // namespace trainer::comm
