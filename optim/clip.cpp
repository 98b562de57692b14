#include "optim/clip.h"

#include <cmath>

#include "models/backend.h"

namespace trainer::optim {

double global_norm(models::Backend& backend, const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  return std::sqrt(backend.sum_of_squares(n, x));
}

double clip_grad_norm(models::Backend& backend, float* grads, int64_t n, double max_norm) {
  const double norm = global_norm(backend, grads, n);
  if (max_norm <= 0) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) backend.scale(n, static_cast<float>(coef), grads);
  return norm;
}

}  // namespace trainer::optim
