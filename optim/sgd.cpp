#include "optim/sgd.h"

#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include "models/backend.h"
#include "optim/state_format.h"

namespace trainer::optim {

using namespace state_format;

Sgd::Sgd(models::Backend& backend, int64_t n, const SgdOptions& options)
    : backend_(backend), n_(n), options_(options) {
  if (n < 0) throw std::invalid_argument("Sgd: negative parameter count");
  if (options.momentum < 0) throw std::invalid_argument("Sgd: momentum must be >= 0");
  if (options.nesterov && options.momentum <= 0)
    throw std::invalid_argument("Sgd: Nesterov momentum requires momentum > 0");
  if (options.momentum != 0) {
    momentum_buffer_ = models::DeviceBuffer(backend, n);
    backend.fill(n, 0.f, momentum_buffer_.data());
  }
}

models::SgdUpdate Sgd::update(double lr, bool first) const {
  // Coefficients are rounded to float once, as PyTorch does when it multiplies a float tensor by a
  // Python scalar; this keeps trajectories within float rounding of torch.optim.SGD.
  models::SgdUpdate u;
  const bool decoupled = options_.decoupled_weight_decay;
  u.neg_lr = static_cast<float>(-lr);
  u.wd = decoupled ? 0.0f : static_cast<float>(options_.weight_decay);
  u.decay = decoupled ? static_cast<float>(1.0 - lr * options_.weight_decay) : 1.0f;
  u.momentum = static_cast<float>(options_.momentum);
  u.use_momentum = !momentum_buffer_.empty();
  u.first = first;
  u.nesterov = options_.nesterov;
  return u;
}

void Sgd::step(float* params, const float* grads, double lr, float grad_scale) {
  models::SgdUpdate u = update(lr, steps_ == 0);
  u.grad_scale = grad_scale;
  backend_.sgd_update(n_, u, params, grads, u.use_momentum ? momentum_buffer_.data() : nullptr);
  ++steps_;
}

void Sgd::step_coefficients(double lr, int64_t, float out[4]) const {
  const models::SgdUpdate u = update(lr, false);
  out[0] = u.neg_lr;
  out[1] = u.decay;
  out[2] = out[3] = 0;
}

// The momentum buffer's first update copies the gradient; a recorded update always blends, so the
// trainer records steps only once an update was applied (StepGraph waits for step_count() > 0).
void Sgd::graph_step(float* params, const float* grads, const models::StepControl* control) {
  if (steps_ == 0) throw std::logic_error("Sgd::graph_step before the first update");
  models::SgdUpdate u = update(0, false);
  u.control = control;
  backend_.sgd_update(n_, u, params, grads, u.use_momentum ? momentum_buffer_.data() : nullptr);
}

std::vector<float> Sgd::momentum_buffer() const {
  std::vector<float> host(static_cast<size_t>(momentum_buffer_.size()));
  models::copy_to_host(backend_, momentum_buffer_.data(), momentum_buffer_.size(), host.data());
  return host;
}

void Sgd::save(std::ostream& out) const {
  write_header(out, kSgd);
  write_pod(out, n_);
  write_pod(out, steps_);
  const std::vector<float> buffer = momentum_buffer();  // the device state, on the host for writing
  const int64_t buffer_len = static_cast<int64_t>(buffer.size());
  write_pod(out, buffer_len);
  out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer_len * sizeof(float)));
  if (!out) throw std::runtime_error("SGD state: write failed");
}

void Sgd::load(std::istream& in) {
  int64_t n = 0, steps = 0, buffer_len = 0;
  read_header(in, kSgd, kAdam);
  if (!read_pod(in, n) || !read_pod(in, steps) || !read_pod(in, buffer_len))
    throw std::runtime_error("SGD state: truncated header");
  if (n != n_)
    throw std::runtime_error("SGD state: holds " + std::to_string(n) +
                             " parameters but the model has " + std::to_string(n_));
  const int64_t expected_len = static_cast<int64_t>(momentum_buffer_.size());
  if (buffer_len != expected_len)
    throw std::runtime_error("SGD state: momentum buffer of " + std::to_string(buffer_len) +
                             " elements, expected " + std::to_string(expected_len) +
                             " (was momentum changed?)");
  if (steps < 0) throw std::runtime_error("SGD state: negative step count");
  // Read into a temporary so a truncated file leaves the optimizer as it was.
  std::vector<float> buffer(static_cast<size_t>(buffer_len));
  if (!in.read(reinterpret_cast<char*>(buffer.data()),
               static_cast<std::streamsize>(buffer_len * sizeof(float))))
    throw std::runtime_error("SGD state: truncated momentum buffer");
  models::copy_to_device(backend_, buffer.data(), buffer_len, momentum_buffer_.data());
  steps_ = steps;
}

std::vector<std::vector<float>> Sgd::element_state() const {
  if (momentum_buffer_.empty()) return {};
  return {momentum_buffer()};
}

void Sgd::set_element_state(const std::vector<std::vector<float>>& state, int64_t steps) {
  const size_t arrays = momentum_buffer_.empty() ? 0 : 1;
  if (state.size() != arrays || (arrays == 1 && static_cast<int64_t>(state[0].size()) != n_) || steps < 0)
    throw std::invalid_argument("SGD state: " + std::to_string(state.size()) + " per-element arrays for " +
                                std::to_string(n_) + " parameters, expected " + std::to_string(arrays) +
                                (arrays ? " of " + std::to_string(n_) : std::string()) + " (momentum " +
                                (arrays ? "on" : "off") + ")");
  if (arrays) models::copy_to_device(backend_, state[0].data(), n_, momentum_buffer_.data());
  steps_ = steps;
}

}  // namespace trainer::optim
