// The 16-bit formats' host loops (half_cast.h). Moved here from comm/wire_format.cpp unchanged, so
// that the CPU backend's to_half / from_half and the wire formats' host path are one code.
#include "models/half_cast.h"

#include <algorithm>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace trainer::models {
namespace {

// Large buckets are converted by all threads; small ones (PowerSGD's factors) by the caller alone.
constexpr int64_t kParallelFrom = int64_t(1) << 16;
constexpr int64_t kBlock = 4096;  // elements per thread chunk, a multiple of the vector width

void narrow_bf16(const float* in, int64_t count, float scale, uint16_t* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelFrom)
  for (int64_t i = 0; i < count; ++i) out[i] = round_to_bf16(in[i] * scale);
}

void widen_bf16_array(const uint16_t* in, int64_t count, float* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelFrom)
  for (int64_t i = 0; i < count; ++i) out[i] = widen_bf16(in[i]);
}

void narrow_bf16_here(const float* in, int64_t count, float scale, uint16_t* out) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = round_to_bf16(in[i] * scale);
}

void widen_bf16_here(const uint16_t* in, int64_t count, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = widen_bf16(in[i]);
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
  for (; i < count; ++i) out[i] = round_to_fp16(in[i] * scale);
}

void widen_fp16_block(const uint16_t* in, int64_t count, float* out) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < count; ++i) out[i] = widen_fp16(in[i]);
}

void narrow_fp16(const float* in, int64_t count, float scale, uint16_t* out) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count >= kParallelFrom)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kBlock;
    narrow_fp16_block(in + begin, std::min(kBlock, count - begin), scale, out + begin);
  }
}

void widen_fp16_array(const uint16_t* in, int64_t count, float* out) {
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count >= kParallelFrom)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kBlock;
    widen_fp16_block(in + begin, std::min(kBlock, count - begin), out + begin);
  }
}

}  // namespace

void narrow_half(HalfFormat format, const float* in, int64_t count, float scale, uint16_t* out) {
  if (format == HalfFormat::kBf16) return narrow_bf16(in, count, scale, out);
  narrow_fp16(in, count, scale, out);
}

void widen_half(HalfFormat format, const uint16_t* in, int64_t count, float* out) {
  if (format == HalfFormat::kBf16) return widen_bf16_array(in, count, out);
  widen_fp16_array(in, count, out);
}

void narrow_half_here(HalfFormat format, const float* in, int64_t count, float scale, uint16_t* out) {
  if (format == HalfFormat::kBf16) return narrow_bf16_here(in, count, scale, out);
  narrow_fp16_block(in, count, scale, out);
}

void widen_half_here(HalfFormat format, const uint16_t* in, int64_t count, float* out) {
  if (format == HalfFormat::kBf16) return widen_bf16_here(in, count, out);
  widen_fp16_block(in, count, out);
}

}  // namespace trainer::models
