#include "comm/sync/low_rank.h"

#include <cmath>

namespace trainer::comm {

namespace {

double column_norm(const float* a, int64_t rows, int64_t cols, int64_t j) {
  double s = 0;
  for (int64_t i = 0; i < rows; ++i) s += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
  return std::sqrt(s);
}

// Column j minus its projections on the (orthonormal or zero) columns before it.
void project_out_earlier(float* a, int64_t rows, int64_t cols, int64_t j) {
  for (int64_t k = 0; k < j; ++k) {
    double dot = 0;
    for (int64_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + k]) * a[i * cols + j];
    const float d = static_cast<float>(dot);
    for (int64_t i = 0; i < rows; ++i) a[i * cols + j] -= d * a[i * cols + k];
  }
}

}  // namespace

void orthonormalize_columns(float* a, int64_t rows, int64_t cols) {
  const int passes = cols > 2 ? 2 : 1;
  for (int64_t j = 0; j < cols; ++j) {
    const double before = column_norm(a, rows, cols, j);
    for (int pass = 0; pass < passes; ++pass) project_out_earlier(a, rows, cols, j);
    const double norm = column_norm(a, rows, cols, j);
    const bool dependent = !(norm > kDependentColumn * before) || !std::isfinite(norm);
    const float scale = dependent ? 0.f : static_cast<float>(1.0 / norm);
    for (int64_t i = 0; i < rows; ++i) a[i * cols + j] = dependent ? 0.f : a[i * cols + j] * scale;
  }
}

void seeded_uniform(uint64_t seed, uint64_t stream, int64_t count, float* out) {
  const uint64_t base = seed * 0x9E3779B97F4A7C15ull + (stream << 32);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t z = base + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = static_cast<float>(static_cast<double>(z >> 40) * 0x1p-23 - 1.0);
  }
}

}  // namespace trainer::comm
