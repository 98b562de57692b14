// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) on one flat buffer.
//
// The update follows torch.optim.Adam and torch.optim.AdamW (amsgrad off, maximize off) operation
// for operation, so that runs can be compared with PyTorch step by step. With t the 1-based step:
//     p = p * (1 - lr * wd)                 (decoupled: AdamW's decay, before everything else)
//     g = grad + wd * p                     (coupled, the torch.optim.Adam default: L2 in the loss)
//     m = beta1 * m + (1 - beta1) * g
//     v = beta2 * v + (1 - beta2) * g * g
//     denom = sqrt(v) / sqrt(1 - beta2^t) + eps      (eps added after the bias correction)
//     p = p - (lr / (1 - beta1^t)) * m / denom
// The bias corrections and the step size are computed in double from the step count, as PyTorch
// computes them in Python; the per-element arithmetic is float32 with each coefficient rounded to
// float once per step, as PyTorch's float kernels do with a Python scalar, and fused multiply-adds
// where PyTorch's kernels fuse (g, m and v), so trajectories match torch bit for bit.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "models/device_buffer.h"
#include "models/backend.h"
#include "optim/optimizer.h"

namespace trainer::optim {

struct AdamOptions {
  double beta1 = 0.9;   // in [0, 1)
  double beta2 = 0.999; // in [0, 1)
  double eps = 1e-8;    // >= 0
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // true: AdamW
};

class Adam final : public Optimizer {
 public:
  // n: elements in the flat parameter (and gradient) buffer, which live on `backend`; so do the
  // moments. Throws std::invalid_argument for a negative n, betas outside [0, 1), or a negative eps
  // or weight decay (as PyTorch does).
  Adam(models::Backend& backend, int64_t n, const AdamOptions& options);

  // One update by the backend's fused adam_update (every element is independent, so the result
  // does not depend on the thread count). grads is not modified.
  void step(float* params, const float* grads, double lr, float grad_scale = 1.f) override;
  void step_coefficients(double lr, int64_t count, float out[4]) const override;
  void graph_step(float* params, const float* grads, const models::StepControl* control) override;
  void set_step_count(int64_t steps) override { steps_ = steps; }

  std::string name() const override { return options_.decoupled_weight_decay ? "adamw" : "adam"; }
  int64_t size() const override { return n_; }
  int64_t step_count() const override { return steps_; }
  const AdamOptions& options() const { return options_; }

  // Host copies of the raw moments (n elements each), for tests and inspection.
  std::vector<float> exp_avg() const;
  std::vector<float> exp_avg_sq() const;

  // Binary state: a header (magic "TADM", version, n, step count, the two moment lengths) followed
  // by the raw little-endian float32 m and v. load() throws std::runtime_error naming what does
  // not match (magic -- saying so when it is an SGD state --, version, element count, moment
  // lengths, truncated stream), leaving this object unchanged on error.
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::vector<std::vector<float>> element_state() const override;
  void set_element_state(const std::vector<std::vector<float>>& state, int64_t steps) override;

 private:
  std::vector<float> host_copy(const models::DeviceBuffer& b) const;

  models::Backend& backend_;
  int64_t n_;
  AdamOptions options_;
  int64_t steps_ = 0;
  // The update at lr after `count` earlier updates.
  models::AdamUpdate update(double lr, int64_t count) const;
  models::DeviceBuffer m_, v_;
};

}  // namespace trainer::optim
