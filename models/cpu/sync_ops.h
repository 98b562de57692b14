// The CPU backend's gradient-sync passes. The sparse ones (Backend::magnitude_histogram,
// select_at_least, accumulate_moments, sparse_to_dense, scatter_fill): on the CPU the sparse
// methods use these only where a device-like backend stands in for a GPU (tests) and for
// GaussianK's moments; their own host path is comm/sync/methods/sparse/select.cpp's vectorized passes, which give
// the same selections. PowerSGD's (orthonormalize_columns, subtract) are its host loops.
#pragma once

#include <cstdint>
#include <vector>

#include "models/backend.h"

namespace trainer::models::cpu {

void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix,
                         int shift, int32_t* histogram);
int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                        int64_t capacity);
void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums);
void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor, float* y);
void scatter_fill(int64_t count, const int32_t* index, float value, float* y);
void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad);
// The matrices in parallel, each on one thread (Backend::orthonormalize_columns).
void orthonormalize_columns(const std::vector<TallMatrix>& batch);
void subtract(int64_t n, const float* a, const float* b, float* y);
// DiLoCo's mixing (Backend::lerp).
void lerp(int64_t n, const float* start, float weight, float* y);

}  // namespace trainer::models::cpu
