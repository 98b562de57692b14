// Inputs for the tests of the low-bit codec on a backend (cuda_low_bit_test, quantized_device_test;
// models/low_bit_blocks.h): random blocks at magnitudes over eight decades, and blocks that reach
// each edge of the formats, in this order from block 0 (as far as n goes):
//   0 zeros; 1 subnormals only (a block flushed to zero by fp8 and int8); 2 max |x| = 448 (fp8's
//   inverse scale is 1) with fp8 ties and saturation; 3 max |x| = 127 (int8's is 1) with int8 and
//   bf16 ties; 4 a NaN; 5 +Inf; 6 -Inf; 7-9 block maxima at 448, 300 and 100 times 2^-126 (around
//   the scale's flush to zero: fp8 keeps the first only, int8 the first two); 10 values near
//   FLT_MAX (at P >= 2 the owner's fp32 sum overflows); 11 large values beside subnormals.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace trainer::testing {

inline std::vector<float> low_bit_input(int64_t n, uint64_t seed) {
  constexpr int64_t B = 256;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> decade(-6.f, 2.f), spread(-2.f, 2.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < n; begin += B) {
    const float magnitude = std::pow(10.f, decade(rng));
    const bool spread_out = (begin / B) % 2 == 1;
    for (int64_t i = begin; i < std::min(n, begin + B); ++i)
      x[i] = normal(rng) * magnitude * (spread_out ? std::pow(10.f, spread(rng)) : 1.f);
  }
  const float inf = std::numeric_limits<float>::infinity(), tiny = std::ldexp(1.f, -126);
  // Block k's first values set to `values`, the rest scaled below the block's max (max_abs).
  auto block = [&](int64_t k, std::vector<float> values, float max_abs) {
    for (int64_t i = k * B, j = 0; i < std::min(n, (k + 1) * B); ++i, ++j)
      x[i] = j < static_cast<int64_t>(values.size()) ? values[j] : max_abs * std::tanh(normal(rng));
  };
  block(0, std::vector<float>(B, 0.f), 0.f);
  block(1, {1e-45f, -3e-45f, 1e-40f, -2e-39f}, 1e-39f);
  // fp8 ties with inverse 1: 8.5 and 9.5 (step 1), 17 (step 2), 232 (step 16), 432 (step 32),
  // 2^-10 and 3 2^-10 (half the subnormal step), 0.5 2^-6 + 2^-10; saturation at 448.
  block(2, {448.f, -448.f, 8.5f, 9.5f, -17.f, 232.f, 432.f, -432.f, std::ldexp(1.f, -10), std::ldexp(3.f, -10),
            std::ldexp(1.f, -7) + std::ldexp(1.f, -10), 447.f, 1e-30f, -1e-42f},
        448.f);
  // int8 ties with inverse 1: 0.5, 1.5, 2.5, 126.5; bf16 ties: 1 + 2^-8 and 1 + 3 2^-8.
  block(3, {127.f, -127.f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 126.5f, 1.f + std::ldexp(1.f, -8),
            -(1.f + std::ldexp(3.f, -8)), 1e-42f},
        127.f);
  block(4, {1.f, std::numeric_limits<float>::quiet_NaN(), -2.f}, 3.f);
  block(5, {inf, 1.f}, 2.f);
  block(6, {-2.f, -inf}, 2.f);
  block(7, {448 * tiny, -448 * tiny}, 448 * tiny);
  block(8, {300 * tiny, -1e-44f}, 300 * tiny);
  block(9, {-100 * tiny}, 100 * tiny);
  block(10, {FLT_MAX, -FLT_MAX, 3e38f}, 3e38f);
  block(11, {1e30f, 1e-40f, -1e-42f, 1e-20f}, 1e30f);
  return x;
}

}  // namespace trainer::testing
