#include "models/cpu/sync_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace trainer::models::cpu {
namespace {

constexpr uint32_t kInfinityKey = 0x7f800000u;

uint32_t magnitude_key(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

void accumulate(int64_t n, const float* grad, float* acc) {
  if (!grad) return;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) acc[i] = grad[i] + acc[i];
}

}  // namespace

void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix,
                         int shift, int32_t* histogram) {
  accumulate(n, grad, acc);
  std::fill(histogram, histogram + 256, 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = magnitude_key(acc[i]);
    if (key >= min_key && key <= kInfinityKey && (key & mask) == prefix) ++histogram[(key >> shift) & 255];
  }
}

int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                        int64_t capacity) {
  accumulate(n, grad, acc);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(std::fabs(acc[i]) >= t)) continue;
    if (count < capacity) {
      index[count] = static_cast<int32_t>(i);
      value[count] = acc[i];
    }
    ++count;
  }
  return count;
}

void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums) {
  // Per-thread partial sums added in thread order (an OpenMP reduction may combine in arrival
  // order, and the threshold GaussianK fits to them must be the same on a resumed run).
  const int threads = omp_get_max_threads();
  std::vector<double> partial(2 * static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t begin = n * t / T, end = n * (t + 1) / T;
    double sum = 0, sum_sq = 0;
#pragma omp simd reduction(+ : sum, sum_sq)
    for (int64_t i = begin; i < end; ++i) {
      const float a = grad[i] + acc[i];
      acc[i] = a;
      sum += a;
      sum_sq += static_cast<double>(a) * a;
    }
    partial[2 * t] = sum;
    partial[2 * t + 1] = sum_sq;
  }
  sums[0] = sums[1] = 0;
  for (int t = 0; t < threads; ++t) sums[0] += partial[2 * t], sums[1] += partial[2 * t + 1];
}

void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor, float* y) {
  std::fill(y, y + n, 0.f);
  for (int64_t j = 0; j < count; ++j) y[index[j]] = value[j] / divisor;
}

void scatter_fill(int64_t count, const int32_t* index, float value, float* y) {
  for (int64_t j = 0; j < count; ++j) y[index[j]] = value;
}

void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) {
  if (nesterov) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float t = velocity[i] + grad[i];
      velocity[i] = momentum * t;
      grad[i] = std::fma(momentum, t, grad[i]);
    }
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) grad[i] = velocity[i] = std::fma(momentum, velocity[i], grad[i]);
}

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

void orthonormalize(float* a, int64_t rows, int64_t cols) {
  const int passes = cols > 2 ? 2 : 1;
  for (int64_t j = 0; j < cols; ++j) {
    const double before = column_norm(a, rows, cols, j);
    for (int pass = 0; pass < passes; ++pass) project_out_earlier(a, rows, cols, j);
    const double norm = column_norm(a, rows, cols, j);
    const bool dependent = !(norm > Backend::kDependentColumn * before) || !std::isfinite(norm);
    const float scale = dependent ? 0.f : static_cast<float>(1.0 / norm);
    for (int64_t i = 0; i < rows; ++i) a[i * cols + j] = dependent ? 0.f : a[i * cols + j] * scale;
  }
}

}  // namespace

void orthonormalize_columns(const std::vector<TallMatrix>& batch) {
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < batch.size(); ++i) orthonormalize(batch[i].data, batch[i].rows, batch[i].cols);
}

void subtract(int64_t n, const float* a, const float* b, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
}

void lerp(int64_t n, const float* start, float weight, float* y) {
  // The two forms as fused multiply-adds, written out: the compiler contracted them so (FMA is in
  // every x86-64-v3 CPU), and saying it keeps the CUDA kernel's bits the same by definition.
  const bool near_start = std::abs(weight) < 0.5f;
  const float rest = 1.f - weight;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float d = y[i] - start[i];
    y[i] = near_start ? std::fma(weight, d, start[i]) : std::fma(-d, rest, y[i]);
  }
}

}  // namespace trainer::models::cpu
