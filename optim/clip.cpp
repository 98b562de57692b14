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
  const float coef = clip_coefficient(norm, max_norm);
  if (coef != 1.f) backend.scale(n, coef, grads);
  return norm;
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.f;
}

}  // namespace trainer::optim
