#include "models/cpu/optim_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainer::models::cpu {
namespace {
// Below this many elements a parallel region costs more than the loop.
constexpr int64_t kParallelFrom = 32768;
// sum_of_squares blocks: large enough that the per-block bookkeeping is negligible, small enough
// that a 27M-element gradient gives every thread many blocks.
constexpr int64_t kBlock = 1 << 16;
}  // namespace

namespace {

// Scaled: the gradient times the clip's coefficient, read in the same pass instead of a scale pass
// before the update. An unscaled update keeps its own loop, the arithmetic it always had. The
// scaled one rounds grad * s first and fuses the weight decay into it explicitly, which is what a
// -march=native build compiled grad + wd * p into once the gradient had been scaled in memory: so
// a binding clip gives the same bits as the two passes did (measured: checkpoints of a clipped
// ResNet-20 run identical before and after). Without FMA hardware (TRAINER_NATIVE off) the fma is a
// library call: exact, slower, and a last bit away from that build's mul + add.
template <bool Scaled>
void sgd_loop(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) {
  const float neg_lr = u.neg_lr, wd = u.wd, decay = u.decay, m = u.momentum, s = u.grad_scale;
  const bool use_momentum = u.use_momentum, first = u.first, nesterov = u.nesterov;
  // Every element is independent, so a static split gives the same result for any thread count.
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
  for (int64_t i = 0; i < n; ++i) {
    float p = params[i];
    float g = Scaled ? std::fma(wd, p, grads[i] * s) : grads[i] + wd * p;
    if (use_momentum) {
      const float b = first ? g : m * momentum[i] + g;
      momentum[i] = b;
      g = nesterov ? g + m * b : b;
    }
    params[i] = p * decay + neg_lr * g;
  }
}

}  // namespace

void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) {
  if (u.grad_scale == 1.f) sgd_loop<false>(n, u, params, grads, momentum);
  else sgd_loop<true>(n, u, params, grads, momentum);
}

void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v) {
  const float neg_step_size = u.neg_step_size, bc2_sqrt = u.bc2_sqrt, eps = u.eps;
  const float b1 = u.b1, one_minus_b1 = u.one_minus_b1, b2 = u.b2, one_minus_b2 = u.one_minus_b2;
  const float wd = u.wd, decay = u.decay, s = u.grad_scale;
  // grad * s is rounded before the fma, as a gradient scaled in memory first would be.
  // Every element is independent, so a static split gives the same result for any thread count.
  // The fused multiply-adds are where PyTorch's CPU kernels fuse (add with alpha, addcmul: measured
  // bit for bit against torch 1.13 on AVX2/AVX-512 machines); the explicit std::fma keeps them fused
  // whatever the compiler's contraction settings. Without -march=native (TRAINER_NATIVE off) on
  // x86 they become library calls: exact, but slower.
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
  for (int64_t i = 0; i < n; ++i) {
    const float p = params[i] * decay;
    const float g = std::fma(wd, p, grads[i] * s);
    const float mi = std::fma(one_minus_b1, g, m[i] * b1);
    const float vi = std::fma(one_minus_b2 * g, g, v[i] * b2);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    params[i] = p + neg_step_size * mi / denom;
  }
}

double sum_of_squares(int64_t n, const float* x) {
  if (n <= 0) return 0.0;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // One partial sum per block rather than an OpenMP reduction: a reduction combines thread results
  // in an unspecified order, and the clip coefficient must not depend on it.
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    double s = 0.0;
    for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double sum = 0.0;
  for (double s : partial) sum += s;
  return sum;
}

void scale(int64_t n, float alpha, float* x) {
#pragma omp parallel for schedule(static) if (n > kParallelFrom)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

}  // namespace trainer::models::cpu
