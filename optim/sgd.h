// Stochastic gradient descent with momentum, Nesterov momentum and weight decay, on one flat buffer.
//
// The update follows torch.optim.SGD (dampening 0) so that runs can be compared with PyTorch step by
// step:
//     g = grad + wd * p                     (coupled weight decay, the default: L2 in the loss)
//     buf = g on the first step, else buf = momentum * buf + g
//     g = g + momentum * buf  (Nesterov)  or  g = buf
//     p = p - lr * g
// With decoupled_weight_decay the decay is not added to the gradient (so it never enters the
// momentum buffer) but shrinks the weights directly, before the gradient step, as SGDW / AdamW do
// (Loshchilov & Hutter 2019):
//     p = p - lr * wd * p,   then the update above with wd = 0.
// Arithmetic is float32, like PyTorch's, with the coefficients rounded to float once per step.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "models/device_buffer.h"
#include "models/backend.h"
#include "optim/optimizer.h"

namespace trainer::optim {

struct SgdOptions {
  double momentum = 0.0;  // 0 disables the momentum buffer entirely (no state is kept)
  bool nesterov = false;  // requires momentum > 0, as in PyTorch
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // SGDW-style decay instead of L2 added to the gradient
};

class Sgd final : public Optimizer {
 public:
  // n: elements in the flat parameter (and gradient) buffer, which live on `backend`; so does the
  // momentum buffer. Throws std::invalid_argument for negative values or Nesterov without momentum.
  Sgd(models::Backend& backend, int64_t n, const SgdOptions& options);

  // One update of params[0, n) from grads[0, n) with learning rate lr, by the backend's fused
  // sgd_update (one pass over memory). grads is not modified (the sync method may still own it).
  // The result does not depend on the thread count.
  void step(float* params, const float* grads, double lr, float grad_scale = 1.f) override;
  void step_coefficients(double lr, int64_t count, float out[4]) const override;
  void graph_step(float* params, const float* grads, const models::StepControl* control) override;
  void set_step_count(int64_t steps) override { steps_ = steps; }

  std::string name() const override { return "sgd"; }
  int64_t size() const override { return n_; }
  const SgdOptions& options() const { return options_; }
  // Steps taken so far; 0 means the next step initializes the momentum buffer from the gradient.
  int64_t step_count() const override { return steps_; }

  // A host copy of the momentum buffer, for checkpoint tests and inspection: empty when
  // momentum == 0, n elements otherwise.
  std::vector<float> momentum_buffer() const;

  // Binary state: a small header (magic, version, n, step count, buffer length) followed by the
  // raw little-endian float32 buffer. load() throws std::runtime_error naming what does not match
  // (wrong magic or version, element count, buffer length, truncated stream), leaving this object
  // unchanged on error.
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::vector<std::vector<float>> element_state() const override;
  void set_element_state(const std::vector<std::vector<float>>& state, int64_t steps) override;

 private:
  models::Backend& backend_;
  int64_t n_;
  SgdOptions options_;
  int64_t steps_ = 0;
  // The update at lr, its momentum buffer initialized from the gradient when `first`.
  models::SgdUpdate update(double lr, bool first) const;
  models::DeviceBuffer momentum_buffer_;
};

}  // namespace trainer::optim
