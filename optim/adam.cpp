#include "optim/adam.h"

#include <cmath>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include "models/backend.h"
#include "optim/state_format.h"

namespace trainer::optim {

using namespace state_format;

Adam::Adam(models::Backend& backend, int64_t n, const AdamOptions& options)
    : backend_(backend), n_(n), options_(options) {
  if (n < 0) throw std::invalid_argument("Adam: negative parameter count");
  // The negated forms also reject NaN.
  if (!(options.beta1 >= 0 && options.beta1 < 1))
    throw std::invalid_argument("Adam: beta1 must be in [0, 1), got " + std::to_string(options.beta1));
  if (!(options.beta2 >= 0 && options.beta2 < 1))
    throw std::invalid_argument("Adam: beta2 must be in [0, 1), got " + std::to_string(options.beta2));
  if (!(options.eps >= 0)) throw std::invalid_argument("Adam: eps must be >= 0");
  if (!(options.weight_decay >= 0)) throw std::invalid_argument("Adam: weight decay must be >= 0");
  m_ = models::DeviceBuffer(backend, n);
  v_ = models::DeviceBuffer(backend, n);
  backend.fill(n, 0.f, m_.data());
  backend.fill(n, 0.f, v_.data());
}

models::AdamUpdate Adam::update(double lr, int64_t count) const {
  const int64_t t = count + 1;
  const double beta1 = options_.beta1, beta2 = options_.beta2;
  // Scalars as PyTorch computes them in Python (double), then rounded to float once where a float
  // kernel takes them.
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(t));
  models::AdamUpdate u;
  u.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  u.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  u.eps = static_cast<float>(options_.eps);
  u.b1 = static_cast<float>(beta1), u.one_minus_b1 = static_cast<float>(1 - beta1);
  u.b2 = static_cast<float>(beta2), u.one_minus_b2 = static_cast<float>(1 - beta2);
  const bool decoupled = options_.decoupled_weight_decay;
  u.wd = decoupled ? 0.0f : static_cast<float>(options_.weight_decay);
  u.decay = decoupled ? static_cast<float>(1.0 - lr * options_.weight_decay) : 1.0f;
  return u;
}

void Adam::step(float* params, const float* grads, double lr, float grad_scale) {
  // The element loop (with the fused multiply-adds where PyTorch's kernels fuse) is the backend's;
  // the CPU's is in models/cpu/optim_ops.cpp.
  models::AdamUpdate u = update(lr, steps_);
  u.grad_scale = grad_scale;
  backend_.adam_update(n_, u, params, grads, m_.data(), v_.data());
  ++steps_;
}

void Adam::step_coefficients(double lr, int64_t count, float out[4]) const {
  const models::AdamUpdate u = update(lr, count);
  out[0] = u.neg_step_size;
  out[1] = u.decay;
  out[2] = u.bc2_sqrt;
  out[3] = 0;
}

void Adam::graph_step(float* params, const float* grads, const models::StepControl* control) {
  models::AdamUpdate u = update(0, steps_);
  u.control = control;
  backend_.adam_update(n_, u, params, grads, m_.data(), v_.data());
}

std::vector<float> Adam::host_copy(const models::DeviceBuffer& b) const {
  std::vector<float> host(static_cast<size_t>(b.size()));
  models::copy_to_host(backend_, b.data(), b.size(), host.data());
  return host;
}

std::vector<float> Adam::exp_avg() const { return host_copy(m_); }
std::vector<float> Adam::exp_avg_sq() const { return host_copy(v_); }

void Adam::save(std::ostream& out) const {
  write_header(out, kAdam);
  write_pod(out, n_);
  write_pod(out, steps_);
  // The device state, on the host for writing.
  const std::vector<float> m = exp_avg(), v = exp_avg_sq();
  const int64_t m_len = static_cast<int64_t>(m.size()), v_len = static_cast<int64_t>(v.size());
  write_pod(out, m_len);
  write_pod(out, v_len);
  out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m_len * sizeof(float)));
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v_len * sizeof(float)));
  if (!out) throw std::runtime_error("Adam state: write failed");
}

void Adam::load(std::istream& in) {
  int64_t n = 0, steps = 0, m_len = 0, v_len = 0;
  read_header(in, kAdam, kSgd);
  if (!read_pod(in, n) || !read_pod(in, steps) || !read_pod(in, m_len) || !read_pod(in, v_len))
    throw std::runtime_error("Adam state: truncated header");
  if (n != n_)
    throw std::runtime_error("Adam state: holds " + std::to_string(n) + " parameters but the model has " +
                             std::to_string(n_));
  if (m_len != n_ || v_len != n_)
    throw std::runtime_error("Adam state: moments of " + std::to_string(m_len) + " and " +
                             std::to_string(v_len) + " elements, expected " + std::to_string(n_) +
                             " each");
  if (steps < 0) throw std::runtime_error("Adam state: negative step count");
  // Read into temporaries so a truncated file leaves the optimizer as it was.
  std::vector<float> m(static_cast<size_t>(m_len)), v(static_cast<size_t>(v_len));
  if (!in.read(reinterpret_cast<char*>(m.data()), static_cast<std::streamsize>(m_len * sizeof(float))))
    throw std::runtime_error("Adam state: truncated first moment (exp_avg)");
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v_len * sizeof(float))))
    throw std::runtime_error("Adam state: truncated second moment (exp_avg_sq)");
  models::copy_to_device(backend_, m.data(), m_len, m_.data());
  models::copy_to_device(backend_, v.data(), v_len, v_.data());
  steps_ = steps;
}

std::vector<std::vector<float>> Adam::element_state() const { return {exp_avg(), exp_avg_sq()}; }

void Adam::set_element_state(const std::vector<std::vector<float>>& state, int64_t steps) {
  if (state.size() != 2 || static_cast<int64_t>(state[0].size()) != n_ ||
      static_cast<int64_t>(state[1].size()) != n_ || steps < 0)
    throw std::invalid_argument("Adam state: " + std::to_string(state.size()) + " per-element arrays for " +
                                std::to_string(n_) + " parameters, expected 2 of " + std::to_string(n_) +
                                " (exp_avg, exp_avg_sq)");
  models::copy_to_device(backend_, state[0].data(), n_, m_.data());
  models::copy_to_device(backend_, state[1].data(), n_, v_.data());
  steps_ = steps;
}

}  // namespace trainer::optim
