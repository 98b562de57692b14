#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainer::optim {

namespace {
// Large enough that the per-block bookkeeping is negligible, small enough that a 27M-element
// gradient gives every thread many blocks.
constexpr int64_t kBlock = 1 << 16;
}  // namespace

double global_norm(const float* x, int64_t n) {
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
  return std::sqrt(sum);
}

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  const double norm = global_norm(grads, n);
  if (max_norm <= 0) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    const float c = static_cast<float>(coef);
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) grads[i] *= c;
  }
  return norm;
}

}  // namespace trainer::optim
