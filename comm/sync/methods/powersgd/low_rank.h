// PowerSGD's seeded first Q (the orthonormalization is a backend op: Backend::orthonormalize_columns).
#pragma once

#include <cstdint>

namespace trainer::comm {

// count floats uniform in [-1, 1), a pure function of (seed, stream, index): element i is
// 2^-23 * (splitmix64(seed * 0x9E3779B97F4A7C15 + (stream << 32) + i) >> 40) - 1, exact in float,
// so NumPy reproduces it bit for bit (scripts/make_powersgd_fixtures.py) and every rank draws the
// same values without communicating. PowerSGD's first Q of the tensor numbered `stream`.
void seeded_uniform(uint64_t seed, uint64_t stream, int64_t count, float* out);

}  // namespace trainer::comm
