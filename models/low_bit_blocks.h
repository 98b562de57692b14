// The low-bit block formats of the outer-gradient allreduce (comm/quantized_allreduce.h, whose
// header states the formats, the rounding, the NaN rules, the error bounds and the wire layout;
// docs/architecture.md section 4, "Wire formats"), as the backends' codec ops
// (Backend::quantize_blocks, sum_quantized_blocks, dequantize_blocks) read and write them. Here
// because models/ must not depend on comm/: the format enum, the chunk layout and the scalar
// conversions, which the CPU loops (models/cpu/low_bit_ops.cpp) and the CUDA kernels
// (models/cuda/low_bit.cu) both call (TRAINER_HOST_DEVICE), so the two produce the same bytes.
//
// What is not here is each side's float arithmetic around these functions: the multiply by the
// block's inverse scale, the owner's fma per rank and the multiply by the scale on the way back.
// The CPU loops write them as plain operators (and std::fma); the CUDA kernels as __fmul_rn and
// __fmaf_rn, which nvcc never contracts into another fma. int8's rounding to an integer is likewise
// std::nearbyint on the host and __float2int_rn on a GPU (both to nearest, ties to even).
//
// A chunk of `blocks` blocks of kQuantBlock elements, as bytes: fp8 and int8 have the `blocks` fp32
// scales first, then the blocks' codes (one byte each); bf16 has no scales, only the codes (two
// bytes each).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "models/bf16.h"
#include "models/float_bits.h"

namespace trainer::models {

enum class LowBitFormat { kBF16, kFP8, kInt8 };

// Elements per scale.
constexpr int64_t kQuantBlock = 256;

// Bytes one element takes (2, 1, 1) and one block's scale (0, 4, 4).
TRAINER_HOST_DEVICE inline int64_t low_bit_element_bytes(LowBitFormat f) { return f == LowBitFormat::kBF16 ? 2 : 1; }
TRAINER_HOST_DEVICE inline int64_t low_bit_scale_bytes(LowBitFormat f) { return f == LowBitFormat::kBF16 ? 0 : 4; }
// One chunk of `blocks` blocks: its scales and its codes.
TRAINER_HOST_DEVICE inline int64_t low_bit_chunk_bytes(LowBitFormat f, int64_t blocks) {
  return blocks * (low_bit_scale_bytes(f) + kQuantBlock * low_bit_element_bytes(f));
}

namespace low_bit {

constexpr float kFp8Max = 448.f;   // E4M3's largest finite value, 1.75 * 2^8
constexpr float kInt8Max = 127.f;  // symmetric int8
constexpr uint32_t kFp8MaxBits = 0x43e00000u;        // 448.f
constexpr uint32_t kFp8MinNormalBits = 0x3c800000u;  // 2^-6
constexpr uint32_t kTwoTo14Bits = 0x46800000u;       // 16384.f, whose last bit is worth 2^-9

TRAINER_HOST_DEVICE inline float qmax_of(LowBitFormat f) { return f == LowBitFormat::kFP8 ? kFp8Max : kInt8Max; }

// fp8 E4M3 (e4m3fn) from a float: to nearest, ties to even, saturating at +-448 (Inf too), NaN to
// S.1111.111. Branch free so that the array loops vectorize (the ternaries become selects). The
// magnitude is first saturated at 448 (as integers: the same order as floats). Below 2^-6 (E4M3's
// subnormals and zero) adding 2^14 makes the float's last bit worth 2^-9, the subnormal step, so
// the FPU's round-to-nearest-even rounds and the low bits of the sum count the steps (8 steps is
// 2^-6, the smallest normal's code 0x08, so a round up into the normals is right too). Above, the
// exponent is rebiased (127 -> 7: minus 120 << 23) and the 20 low bits are rounded away to nearest
// even; a carry into the exponent is right, and nothing at or below 448 rounds past 448's code 0x7e.
// The one float add sees an operand made from integer bits, so no compiler can contract it with the
// caller's multiply.
TRAINER_HOST_DEVICE inline uint8_t e4m3_from(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t magnitude = b & 0x7fffffffu;
  // std::min on the host: around the ternary GCC vectorized the quantize loop less well (fp8's
  // quantize of 27.5M floats took 22-23 ms on one thread instead of 18-19).
#if defined(__CUDA_ARCH__)
  const uint32_t a = magnitude < kFp8MaxBits ? magnitude : kFp8MaxBits;
#else
  const uint32_t a = std::min(magnitude, kFp8MaxBits);
#endif
  const uint32_t small = bits_of(float_of(a) + 16384.f) - kTwoTo14Bits;
  const uint32_t normal = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  const uint32_t code = a < kFp8MinNormalBits ? small : normal;
  const bool nan = magnitude > 0x7f800000u;
  return static_cast<uint8_t>(sign | (nan ? 0x7fu : code));
}

// Exact: a normal code is a float with the exponent rebiased (7 -> 127) and the 3 mantissa bits on
// top; a subnormal one is m 2^-9 (m < 8, exact in a float). The choice is made with bit masks rather
// than ternaries: GCC will not turn a ternary with a floating-point multiply in one arm into a select
// (the multiply could trap, -ftrapping-math), and the loops stayed scalar: `trainer bench outer`'s fp8
// work on this rank took 178 ms instead of 46 (27.5M floats, P = 2).
TRAINER_HOST_DEVICE inline float e4m3_to(uint8_t q) {
  const uint32_t code = q, magnitude_code = code & 0x7fu;
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t normal = (magnitude_code << 20) + (120u << 23);
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(code & 0x7u)) * 0x1p-9f);
  const uint32_t is_normal = 0u - static_cast<uint32_t>(magnitude_code >= 0x08u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude_code == 0x7fu);
  const uint32_t magnitude = (normal & is_normal) | (subnormal & ~is_normal);
  return float_of(sign | (0x7fc00000u & is_nan) | (magnitude & ~is_nan));
}

// int8's saturation at +-127 before the rounding to an integer (NaN passes through: it compares
// false both ways, and the caller maps it to 0).
TRAINER_HOST_DEVICE inline float int8_saturated(float x) {
  return x > kInt8Max ? kInt8Max : (x < -kInt8Max ? -kInt8Max : x);
}

// int8 from a float on the host: saturated, rounded to the nearest integer, ties to even (nearbyint
// in the default rounding mode), NaN to 0 (the block's scale carries the NaN). The CUDA kernels'
// copy rounds with __float2int_rn (models/cuda/low_bit.cu).
inline int8_t int8_from(float x) {
  return static_cast<int8_t>(x == x ? static_cast<int>(std::nearbyint(int8_saturated(x))) : 0);
}

// An IEEE fp32 division, rounded to nearest even (on a GPU whatever -prec-div says).
TRAINER_HOST_DEVICE inline float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// A block's scale from its max |x| (A): scale = A / qmax and inverse = qmax / A in fp32; both 0
// when A / qmax is below FLT_MIN (zeros); scale NaN (0x7fc00000) and inverse 0 when A is not
// finite (a NaN or Inf in the block).
struct Scale {
  float scale, inverse;
};
TRAINER_HOST_DEVICE inline Scale block_scale(LowBitFormat f, float max_abs) {
  if ((bits_of(max_abs) & 0x7fffffffu) >= 0x7f800000u) return {float_of(0x7fc00000u), 0.f};
  const float qmax = qmax_of(f);
  const float scale = divide_rn(max_abs, qmax);
  if (!(scale >= FLT_MIN)) return {0.f, 0.f};
  return {scale, divide_rn(qmax, max_abs)};
}

// bf16's codes: models/bf16.h's conversions (to nearest even, NaN kept and quieted, Inf kept), the
// same as comm/wire_format.h's.
TRAINER_HOST_DEVICE inline uint16_t bf16_from(float x) { return round_to_bf16(x); }
TRAINER_HOST_DEVICE inline float bf16_to(uint16_t h) { return widen_bf16(h); }

}  // namespace low_bit
}  // namespace trainer::models
