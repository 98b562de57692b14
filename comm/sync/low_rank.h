// The small dense kernels of low-rank gradient compression (PowerSGD), kept apart from the method
// so that a device backend can take each one over: they are plain loops over host floats today.
#pragma once

#include <cstdint>

namespace trainer::comm {

// Makes the `cols` columns of the row-major rows x cols matrix `a` orthonormal, in place, by
// Gram-Schmidt: each column is normalized after the earlier ones are projected out. For more than
// two columns the projection is applied twice ("twice is enough", Giraud et al. 2005), which gives
// the orthogonality of Householder QR; the result equals QR's Q up to the signs of its columns.
// Dot products accumulate in double. Rank deficiency: a column whose norm after projection is at
// most kDependentColumn of its norm before (or zero, or not finite) is set to zero rather than
// normalized from rounding noise (PyTorch's hook divides by zero there unless its epsilon is set);
// a zero column contributes nothing to P Q^T, and error feedback keeps what it would have carried.
void orthonormalize_columns(float* a, int64_t rows, int64_t cols);
constexpr double kDependentColumn = 1e-4;

// count floats uniform in [-1, 1), a pure function of (seed, stream, index): element i is
// 2^-23 * (splitmix64(seed * 0x9E3779B97F4A7C15 + (stream << 32) + i) >> 40) - 1, exact in float,
// so NumPy reproduces it bit for bit (scripts/make_powersgd_fixtures.py) and every rank draws the
// same values without communicating. PowerSGD's first Q of the tensor numbered `stream`.
void seeded_uniform(uint64_t seed, uint64_t stream, int64_t count, float* out);

}  // namespace trainer::comm
