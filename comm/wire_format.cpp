#include "comm/wire_format.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "models/bf16.h"
#include "models/float_bits.h"

namespace trainer::comm {

namespace {

using models::bits_of;
using models::float_of;

// bf16 is models/bf16.h's (the CPU backend's bf16 activations round the same way).
inline uint16_t bf16_from(float x) { return models::round_to_bf16(x); }
inline float bf16_to(uint16_t h) { return models::widen_bf16(h); }

inline uint16_t fp16_from(float x) {
  uint32_t b = bits_of(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  b &= 0x7fffffffu;
  if (b > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((b >> 13) & 0x3ffu));  // NaN, quieted
  if (b >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // |x| >= 65520 (and Inf): Inf
  if (b < 0x38800000u) {
    // |x| < 2^-14: an fp16 subnormal (or zero, or 2^-14 after rounding up). Adding 0.5 makes the
    // float's last bit worth 2^-24, the subnormal step, so the FPU's round-to-nearest-even does the
    // rounding, and the result's low bits count the steps. (Needs the default rounding mode and no
    // flush-to-zero of the inputs that matter here, which are normal floats above 2^-26.)
    const float shifted = float_of(b) + 0.5f;
    return static_cast<uint16_t>(sign | (bits_of(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and round away the 13 low bits
  // to nearest even; a carry into the exponent is again right.
  b += 0xc8000000u + 0xfffu + ((b >> 13) & 1u);
  return static_cast<uint16_t>(sign | (b >> 13));
}

inline float fp16_to(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return float_of(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact: at most 10 bits
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Large buckets are converted by all threads; small ones (PowerSGD's factors) by the caller alone.
constexpr int64_t kParallelFrom = int64_t(1) << 16;
constexpr int64_t kBlock = 4096;  // elements per thread chunk, a multiple of the vector width

void narrow_bf16(const float* in, int64_t count, float scale, uint16_t* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelFrom)
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_from(in[i] * scale);
}

void widen_bf16(const uint16_t* in, int64_t count, float* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelFrom)
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to(in[i]);
}

// fp16 in blocks: the F16C instructions on 8 floats at a time where the build has them, the scalar
// definition for the tail and elsewhere.
void narrow_fp16_block(const float* in, int64_t count, float scale, uint16_t* out) {
  int64_t i = 0;
#if defined(__F16C__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(in + i), s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < count; ++i) out[i] = fp16_from(in[i] * scale);
}

void widen_fp16_block(const uint16_t* in, int64_t count, float* out) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < count; ++i) out[i] = fp16_to(in[i]);
}

void narrow_fp16(const float* in, int64_t count, float scale, uint16_t* out) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count >= kParallelFrom)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kBlock;
    narrow_fp16_block(in + begin, std::min(kBlock, count - begin), scale, out + begin);
  }
}

void widen_fp16(const uint16_t* in, int64_t count, float* out) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count >= kParallelFrom)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kBlock;
    widen_fp16_block(in + begin, std::min(kBlock, count - begin), out + begin);
  }
}

[[noreturn]] void not_16_bit(const char* what) {
  throw std::invalid_argument(std::string(what) + ": fp32 is not a 16-bit wire format");
}

}  // namespace

std::string wire_dtype_name(WireDType wire) { return wire_dtype_names().at(static_cast<size_t>(wire)); }

int64_t wire_bytes(WireDType wire) { return wire == WireDType::kF32 ? 4 : 2; }

DType wire_comm_dtype(WireDType wire) {
  switch (wire) {
    case WireDType::kF32: return DType::kF32;
    case WireDType::kBF16: return DType::kBF16;
    case WireDType::kF16: return DType::kF16;
  }
  return DType::kF32;
}

float wire_pre_scale(WireDType wire, int world_size) {
  return wire == WireDType::kF16 ? 1.f / static_cast<float>(world_size) : 1.f;
}

uint16_t float_to_bf16(float x) { return bf16_from(x); }
float bf16_to_float(uint16_t h) { return bf16_to(h); }
uint16_t float_to_fp16(float x) { return fp16_from(x); }
float fp16_to_float(uint16_t h) { return fp16_to(h); }

void narrow(WireDType wire, const float* in, int64_t count, float scale, uint16_t* out) {
  if (wire == WireDType::kBF16) return narrow_bf16(in, count, scale, out);
  if (wire == WireDType::kF16) return narrow_fp16(in, count, scale, out);
  not_16_bit("narrow");
}

void widen(WireDType wire, const uint16_t* in, int64_t count, float* out) {
  if (wire == WireDType::kBF16) return widen_bf16(in, count, out);
  if (wire == WireDType::kF16) return widen_fp16(in, count, out);
  not_16_bit("widen");
}

void wire_add(WireDType wire, const uint16_t* in, uint16_t* inout, int64_t count) {
  if (wire == WireDType::kBF16) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) inout[i] = bf16_from(bf16_to(in[i]) + bf16_to(inout[i]));
    return;
  }
  if (wire != WireDType::kF16) not_16_bit("wire_add");
  // Through fp32 in blocks, so the F16C paths of widen and narrow serve the reduction too.
  float a[kBlock / 4], b[kBlock / 4];
  for (int64_t begin = 0; begin < count; begin += kBlock / 4) {
    const int64_t n = std::min(kBlock / 4, count - begin);
    widen_fp16_block(in + begin, n, a);
    widen_fp16_block(inout + begin, n, b);
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    narrow_fp16_block(a, n, 1.f, inout + begin);
  }
}

void allreduce_sum_through_wire(Communicator& comm, float* data, int64_t count, WireDType wire, float pre_scale,
                                std::vector<uint16_t>& scratch, const char* tag) {
  if (wire == WireDType::kF32) {
    if (pre_scale != 1.f)
      for (int64_t i = 0; i < count; ++i) data[i] *= pre_scale;
    comm.allreduce(data, count, DType::kF32, ReduceOp::kSum, tag);
    return;
  }
  if (static_cast<int64_t>(scratch.size()) < count) scratch.resize(static_cast<size_t>(count));
  narrow(wire, data, count, pre_scale, scratch.data());
  comm.allreduce(scratch.data(), count, wire_comm_dtype(wire), ReduceOp::kSum, tag);
  widen(wire, scratch.data(), count, data);
}

}  // namespace trainer::comm
