#include "models/cpu/low_bit_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace trainer::models::cpu {

namespace {

using namespace low_bit;

// From this many blocks (2^16 elements) a loop runs on all threads; below, on the caller's alone (as
// in comm/wire_format.cpp: small buffers are not worth a parallel region).
constexpr int64_t kParallelFromBlocks = (int64_t(1) << 16) / kQuantBlock;
// bf16's run of codes: threaded from as many elements (wire_format.cpp's narrow, whose loop this is).
constexpr int64_t kParallelFromElements = int64_t(1) << 16;

// The block's largest |x| as float bits: for non-negative floats integer order is float order, and
// NaN's patterns lie above Inf's, so one integer max finds the max and any NaN or Inf alike. Always
// inlined: GCC kept it out of line in quantize's block loop, and fp8's and int8's quantize took
// 20-25% longer (27.5M floats, one thread).
[[gnu::always_inline]] inline uint32_t max_abs_bits(const float* x, int64_t count) {
  uint32_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < count; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    m = std::max(m, b & 0x7fffffffu);
  }
  return m;
}

// A chunk (low_bit_blocks.h's layout): `blocks` scales (fp8, int8), then `blocks` x kQuantBlock codes.
// The loops are templates on the format, so that each inner loop is one straight conversion.
template <LowBitFormat F>
struct Chunk {
  using Code = std::conditional_t<F == LowBitFormat::kBF16, uint16_t,
                                  std::conditional_t<F == LowBitFormat::kFP8, uint8_t, int8_t>>;
  // Read-only chunks (the sum's and the decoding's) are only read through it.
  Chunk(const uint8_t* chunk, int64_t blocks)
      : scales(reinterpret_cast<float*>(const_cast<uint8_t*>(chunk))),
        payload(reinterpret_cast<Code*>(const_cast<uint8_t*>(chunk) + blocks * low_bit_scale_bytes(F))) {}
  float* scales;
  Code* payload;
  float scale(int64_t block) const { return F == LowBitFormat::kBF16 ? 1.f : scales[block]; }
  static float decode(Code q) {
    if constexpr (F == LowBitFormat::kBF16) return bf16_to(q);
    else if constexpr (F == LowBitFormat::kFP8) return e4m3_to(q);
    else return static_cast<float>(q);
  }
};

template <LowBitFormat F>
void quantize(const float* x, int64_t count, int64_t blocks, uint8_t* chunk) {
  const Chunk<F> c(chunk, blocks);
  using Code = typename Chunk<F>::Code;
  if constexpr (F == LowBitFormat::kBF16) {
    // No scales: the chunk is one run of bf16 (threaded for large runs).
    Code* out = c.payload;
#pragma omp parallel for simd schedule(static) if (count >= kParallelFromElements)
    for (int64_t i = 0; i < count; ++i) out[i] = bf16_from(x[i]);
    std::fill(c.payload + count, c.payload + blocks * kQuantBlock, Code{0});
    return;
  }
#pragma omp parallel for schedule(static) if (blocks >= kParallelFromBlocks)
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t begin = k * kQuantBlock;
    const int64_t valid = std::clamp<int64_t>(count - begin, 0, kQuantBlock);
    Code* out = c.payload + begin;
    std::fill(out + valid, out + kQuantBlock, Code{0});
    if (valid == 0) {
      c.scales[k] = 0.f;
      continue;
    }
    const float* in = x + begin;
    const Scale s = block_scale(F, float_of(max_abs_bits(in, valid)));
    c.scales[k] = s.scale;
    const float inverse = s.inverse;
#pragma omp simd
    for (int64_t i = 0; i < valid; ++i) {
      if constexpr (F == LowBitFormat::kFP8) out[i] = e4m3_from(in[i] * inverse);
      else out[i] = int8_from(in[i] * inverse);
    }
  }
}

template <LowBitFormat F>
void sum(const uint8_t* received, int64_t chunk_bytes, int ranks, int64_t blocks, float* acc) {
#pragma omp parallel for schedule(static) if (blocks >= kParallelFromBlocks)
  for (int64_t k = 0; k < blocks; ++k) {
    float* out = acc + k * kQuantBlock;
    std::fill(out, out + kQuantBlock, 0.f);
    for (int r = 0; r < ranks; ++r) {
      const Chunk<F> c(received + r * chunk_bytes, blocks);
      const float s = c.scale(k);
      const auto* q = c.payload + k * kQuantBlock;
#pragma omp simd
      for (int64_t i = 0; i < kQuantBlock; ++i) out[i] = std::fma(Chunk<F>::decode(q[i]), s, out[i]);
    }
  }
}

template <LowBitFormat F>
void dequantize(const uint8_t* chunk, int64_t blocks, int64_t count, float* out) {
  const Chunk<F> c(chunk, blocks);
  const int64_t used = (count + kQuantBlock - 1) / kQuantBlock;
#pragma omp parallel for schedule(static) if (used >= kParallelFromBlocks)
  for (int64_t k = 0; k < used; ++k) {
    const float s = c.scale(k);
    const int64_t begin = k * kQuantBlock, valid = std::min(kQuantBlock, count - begin);
    const auto* q = c.payload + begin;
    float* o = out + begin;
#pragma omp simd
    for (int64_t i = 0; i < valid; ++i) o[i] = Chunk<F>::decode(q[i]) * s;
  }
}

}  // namespace

void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks, uint8_t* chunk) {
  switch (format) {
    case LowBitFormat::kBF16: return quantize<LowBitFormat::kBF16>(x, count, blocks, chunk);
    case LowBitFormat::kFP8: return quantize<LowBitFormat::kFP8>(x, count, blocks, chunk);
    case LowBitFormat::kInt8: return quantize<LowBitFormat::kInt8>(x, count, blocks, chunk);
  }
}

void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks, int64_t blocks,
                          float* acc) {
  switch (format) {
    case LowBitFormat::kBF16: return sum<LowBitFormat::kBF16>(received, chunk_bytes, ranks, blocks, acc);
    case LowBitFormat::kFP8: return sum<LowBitFormat::kFP8>(received, chunk_bytes, ranks, blocks, acc);
    case LowBitFormat::kInt8: return sum<LowBitFormat::kInt8>(received, chunk_bytes, ranks, blocks, acc);
  }
}

void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count, float* out) {
  switch (format) {
    case LowBitFormat::kBF16: return dequantize<LowBitFormat::kBF16>(chunk, blocks, count, out);
    case LowBitFormat::kFP8: return dequantize<LowBitFormat::kFP8>(chunk, blocks, count, out);
    case LowBitFormat::kInt8: return dequantize<LowBitFormat::kInt8>(chunk, blocks, count, out);
  }
}

}  // namespace trainer::models::cpu
