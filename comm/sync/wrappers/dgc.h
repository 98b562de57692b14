// Deep Gradient Compression (Lin et al., ICLR 2018; docs/methods.md "Deep Gradient Compression") for
// the four sparse selectors (oktopk, topka, gaussiank, gtopk), in one place: ErrorFeedbackSync
// (error_feedback_sync.h) runs it around every selector's step.
//
// Momentum correction (sync.<method>.dgc): the method owns SGD's momentum m (optim.momentum; the optimizer
// then steps without momentum). Per rank and step, with g the rank's gradient:
//   u = m u + g,        v += u              (optim.nesterov: u = m (u + g),  v += u + g)
// where v is error feedback's residual (error_feedback.h), so the selection runs over the
// accumulated velocity instead of the accumulated gradient, and the output the optimizer applies
// is the average of the selected v entries (the momentum is in them already).
// Momentum factor masking: where v was sent (its residual cleared), u is cleared too, so a stale
// velocity does not keep pushing an entry that was just applied.
// Local gradient clipping: with optim.grad_clip_norm = C > 0 each rank scales its own g to an L2
// norm of at most C N^-1/2 (N ranks) before it enters u (the paper's rule: the sum of N such
// gradients has a norm of about C when they are independent); the trainer then clips nothing after
// the sync. The steps of a dense warmup (sync.dense_warmup_steps) apply the momentum to the averaged
// gradient instead (u = m u + g_avg, output u; Nesterov u + g_avg), after clipping it at C.
//
// Weight decay, as DGC's reference does it (its DGCSGD optimizer): coupled decay (optim.weight_decay
// without optim.decoupled_weight_decay) is not compressed: a second, dense velocity w = m w + lambda p
// (Nesterov: w = m (w + lambda p), adding lambda p + w) is kept from the parameters, which every rank
// holds equal, and added to the output after the sync. SGD with momentum on g + lambda p splits
// exactly so, momentum being linear; the optimizer then gets no weight decay either. Decoupled
// decay stays the optimizer's (applied to the weights, outside momentum).
//
// The sparsity warm-up (sync.<method>.density_warmup_steps, with or without sync.<method>.dgc) is DensityWarmup.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <istream>
#include <string>
#include <vector>

#include "comm/sync/wrappers/error_feedback.h"
#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::comm {

struct DgcSettings {
  double momentum = 0.9;  // optim.momentum
  bool nesterov = false;  // optim.nesterov
  double clip_norm = 0;   // optim.grad_clip_norm (C; 0: no clipping)
  int ranks = 1;          // N
  double weight_decay = 0;  // coupled optim.weight_decay (lambda; 0: none or decoupled)
};

// sync.<method>.density_warmup_*: the density of step s, falling exponentially from `start` to `target` in
// `stages` equal stages over the first `steps` steps of the run (DGC's 25%, 6.25%, 1.56%, 0.4%, then
// 0.1%): stage i = floor(s * stages / steps) runs at start * (target / start)^(i / stages), and from
// step `steps` on the target. Counted in the run's steps, a dense warmup's included.
struct DensityWarmup {
  int64_t steps = 0;  // 0: off
  double start = 0.25;
  int64_t stages = 4;
  double target = 0.01;  // sync.<method>.density

  bool on() const { return steps > 0; }
  double density_at(int64_t step) const;
};

class DgcMomentum {
 public:
  // `backend`: where the gradient and the velocity live (a host backend: host memory).
  DgcMomentum(int64_t n, models::Backend& backend, const DgcSettings& settings);
  const DgcSettings& settings() const { return settings_; }
  int64_t size() const { return n_; }

  // A compressed step, before error feedback forms acc: clips this rank's gradient at C N^-1/2,
  // then u = m u + g and g = what v accumulates (u; Nesterov u + g), in place.
  void correct_local(float* grad);
  // A dense warmup step, after the average: clips it at C, then the same update; g becomes what the
  // optimizer applies.
  void correct_averaged(float* grad);
  // After the step's output: the weight decay's own momentum from the parameters (equal on every
  // rank), w = m w + lambda p, added to the output (Nesterov: lambda p + m w). No-op without decay.
  void add_decay(float* output, const float* params);
  // Momentum factor masking after the step's selection: u = 0 where the residual was cleared. On the
  // host from the residual's pending clears; on a device the passes clear u with the residual
  // (ErrorFeedback::set_cleared_with), so this does nothing there.
  void mask(const ErrorFeedback& ef);
  // The velocity in the device's memory (allocated, zero, on first use), for set_cleared_with.
  float* device_velocity();
  // The velocity as host floats (empty before the first step), for tests and checkpoints.
  std::vector<float> values() const;
  // The weight decay's velocity w, the same way.
  std::vector<float> decay_values() const;

  // u, then w: each a count, a presence byte and the raw floats (as ErrorFeedback::save).
  void save(std::ostream& out) const;
  void load(std::istream& in);  // throws std::runtime_error naming what does not match
  // Elastic resume: the mean of the saved ranks' velocities (rank_mean.h); w is the same on every
  // rank, so its mean is itself.
  void load_mean(const std::vector<std::istream*>& saved);

 private:
  // n floats where the velocity lives: host memory or the device's, allocated (zero) on first use.
  struct Buffer {
    std::vector<float> host;
    models::DeviceBuffer device;
  };
  float* storage(Buffer& b);
  std::vector<float> read(const Buffer& b) const;
  void adopt(Buffer& b, std::vector<float> values);
  void update(float* grad, double clip_at);

  int64_t n_;
  models::Backend& backend_;
  bool on_host_;
  DgcSettings settings_;
  Buffer velocity_, decay_, scratch_;
};

}  // namespace trainer::comm
