// Remedies for stale gradients that an async_ps server applies per push (comm/sync/methods/async_ps/async_ps_server.h),
// besides the lr rules inverse and dc that live in the server itself:
//
//   momentum correction  (sync.async_ps.momentum_correction; Mitliagkas et al. 2016, "Asynchrony begets
//                        momentum"): with W workers whose pushes arrive in a queue, asynchrony acts
//                        like an extra momentum of about 1 - 1/W on top of the optimizer's. The
//                        servers' explicit momentum is lowered by that much so the two together
//                        are about the recipe's momentum.
//
//   gap-aware damping    (sync.async_ps.staleness_lr = "gap"; Barkai, Hakimi and Schuster, ICLR 2020): the
//                        staleness of a push is measured not in versions but in how far the
//                        weights moved since the worker pulled them, per element, in units of one
//                        average update: Gap = |w_now - w_pulled| / C with C = max_lr x RMS of the
//                        updates' direction (an exponential average, decay 0.999, bias-corrected,
//                        of (step / lr)^2, i.e. of the momentum buffer's square for SGD). The
//                        push's gradient (and its weight decay term) is divided by 1 + Gap: a push
//                        computed on weights that did not move is applied in full, one whose
//                        weights moved k average updates is applied at 1 / (1 + k).
//                        One "update" is one push here (lr / W), as one worker's gradient is one
//                        update of the paper's asynchronous SGD.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

namespace trainer::comm {

// The servers' SGD momentum under sync.async_ps.momentum_correction with W workers: max(0, mu - (1 - 1/W)).
double corrected_momentum(double momentum, int workers);

class GapAwareDamping {
 public:
  static constexpr double kDecay = 0.999;   // the paper's running average of the squared steps
  static constexpr double kEpsilon = 1e-8;  // keeps C positive where nothing moved yet

  explicit GapAwareDamping(int64_t n) : mean_square_(static_cast<size_t>(n), 0.f) {}

  // Divides grad (n floats, the push's gradient before the optimizer adds weight decay) by
  // 1 + |w_now - w_pulled| / C element by element, and adds weight_decay * w_now * (1/penalty - 1)
  // so that the optimizer's coupled decay term (g + wd * w) is divided alike. No damping before the
  // first observed update (C is not known yet).
  void damp(float* grad, const float* w_now, const float* w_pulled, float weight_decay) const;

  // After an update at learning rate lr took the weights from `before` to `after`: the running
  // average of (step / lr)^2 and the largest lr seen (the C of later pushes).
  void observe(const float* before, const float* after, double lr);

  int64_t updates() const { return updates_; }
  int64_t size() const { return static_cast<int64_t>(mean_square_.size()); }
  void save(std::ostream& out) const;
  void load(std::istream& in);  // throws std::runtime_error on a size mismatch or truncation
  static GapAwareDamping read(std::istream& in);  // a saved state of any size (throws on truncation)

  // Re-sharding the servers (comm/sync/methods/async_ps/async_ps_state.h): the state of elements [begin, end), and
  // the states of consecutive element ranges joined in order. Every part has seen the same updates
  // (each server observes every update), so the count and the largest lr are the same in all:
  // join throws std::runtime_error naming the part where they differ.
  GapAwareDamping slice(int64_t begin, int64_t end) const;
  static GapAwareDamping join(const std::vector<GapAwareDamping>& parts);

 private:
  std::vector<float> mean_square_;  // per element: running average of (step / lr)^2, not yet bias-corrected
  int64_t updates_ = 0;
  double max_lr_ = 0;
};

}  // namespace trainer::comm
