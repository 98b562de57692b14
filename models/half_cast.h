// The two 16-bit float formats gradients may travel in (sync.wire_dtype, comm/wire_format.h):
// bfloat16 (models/bf16.h's rounding) and IEEE binary16 "fp16". The scalar definitions here are
// the only ones: the host loops below and the CUDA kernels (models/cuda/half_cast.cu) call them, so
// a bucket cast on a GPU has the CPU's bits.
//
// Narrowing rounds to nearest, ties to even; NaN stays NaN (quiet, sign and top payload bits kept),
// Inf stays Inf, subnormals are rounded, not flushed; fp16 overflow (|x| >= 65520, halfway past
// 65504) gives Inf. Widening is exact (a NaN comes back quiet).
#pragma once

#include <cstdint>
#include <cstring>

#include "models/bf16.h"

namespace trainer::models {

enum class HalfFormat { kBf16, kFp16 };

TRAINER_HOST_DEVICE inline uint16_t round_to_fp16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  const uint32_t sign = (b >> 16) & 0x8000u;
  b &= 0x7fffffffu;
  if (b > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((b >> 13) & 0x3ffu));  // NaN, quieted
  if (b >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // |x| >= 65520 (and Inf): Inf
  if (b < 0x38800000u) {
    // |x| < 2^-14: an fp16 subnormal (or zero, or 2^-14 after rounding up). Adding 0.5 makes the
    // float's last bit worth 2^-24, the subnormal step, so the FPU's round-to-nearest-even does the
    // rounding, and the result's low bits count the steps. (Needs the default rounding mode and no
    // flush-to-zero of the inputs that matter here, which are normal floats above 2^-26: nvcc's
    // default -ftz=false, and no fast-math on the host.)
    float magnitude;
    std::memcpy(&magnitude, &b, sizeof magnitude);
    const float shifted = magnitude + 0.5f;
    uint32_t s;
    std::memcpy(&s, &shifted, sizeof s);
    return static_cast<uint16_t>(sign | (s - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and round away the 13 low bits
  // to nearest even; a carry into the exponent is again right.
  b += 0xc8000000u + 0xfffu + ((b >> 13) & 1u);
  return static_cast<uint16_t>(sign | (b >> 13));
}

TRAINER_HOST_DEVICE inline float widen_fp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t b = 0;
  if (exponent == 0x1f) {
    b = sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u);
  } else if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact: at most 10 bits
    return sign ? -magnitude : magnitude;
  } else {
    b = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// The array forms on the host: out[i] = the format's rounding of (in[i] * scale), the product in
// fp32 and fused into the same pass (scale 1 is exact); widen: out[i] = in[i] as fp32. Large arrays
// are converted by all OpenMP threads, small ones by the caller alone. With F16C (x86-64-v3 and
// -march=native builds) fp16 uses the hardware conversion, which rounds the same way; bf16's loop
// is integer arithmetic the compiler vectorizes. The CPU backend's to_half / from_half.
void narrow_half(HalfFormat format, const float* in, int64_t count, float scale, uint16_t* out);
void widen_half(HalfFormat format, const uint16_t* in, int64_t count, float* out);
// The same on the calling thread only, whatever the count (a reduction's chunks).
void narrow_half_here(HalfFormat format, const float* in, int64_t count, float scale, uint16_t* out);
void widen_half_here(HalfFormat format, const uint16_t* in, int64_t count, float* out);

}  // namespace trainer::models
