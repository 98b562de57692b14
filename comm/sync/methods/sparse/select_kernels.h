// The two vector loops of the selection code (comm/sync/methods/sparse/select.cpp), one version per instruction
// set: the selection pass (acc = grad + residual where error feedback asks for it, then every entry
// with |x| >= lo appended to an (index, value) list) and the dense output (a sorted sparse list
// expanded into a zero-filled buffer). Included by select.cpp only, which picks the version once per
// process (selection_isa() in select.h).
//
// Why three versions, each compiled for its own target by attribute rather than by -march: a binary
// built for x86-64-v3 (TRAINER_NATIVE=OFF, so it runs on any AVX2 machine) still gets the AVX-512
// loop where the CPU has it, and an AVX2-only CPU gets a vector loop instead of the scalar one,
// which takes about three times as long as reading the memory it touches. The scalar version stays
// for other CPUs and as the definition the tests compare the others with.
//
// Every version computes the same floats in the same order (one add per accumulated entry, no FMA,
// the same >= comparison, zeros as +0.f), so the lists, the residuals, the flags and the dense output
// are bitwise the same whichever runs; tests/select_test.cpp checks that.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "comm/sync/methods/sparse/select.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TRAINER_SELECT_X86 1
#endif

namespace trainer::comm::select_kernels {

enum class Isa { scalar, avx2, avx512 };

// Appends every i in [begin, end) with |x_i| >= lo to (index, value) and returns how many; x is
// the source's grad, or grad + residual (written back to the residual, flagged entries counting
// as zero and their flags reset). begin is a multiple of 16. Branch free: the vector versions store
// whole vectors (up to 16 entries past the count), the scalar one a candidate slot per entry, and
// the count advances by the comparison, so a 2% selection rate costs no branch mispredictions.
using SelectKernel = int64_t (*)(const SelectSource& src, int64_t begin, int64_t end, float lo, int32_t* index,
                                 float* value);

// The dense output of whole 16-entry words [w0, w1): dst[16w + j] = the next value where bit j of
// bits[w] is set, else 0, starting at value[at]; bits[w] is reset. With `mine`, entries flagged in
// both mine[w] and bits[w] are flagged in clear[w], mine[w] is reset, and the kernel returns how
// many (else 0). `stream`: dst is 64-byte aligned, use non-temporal stores.
struct OutputWords {
  float* dst;
  uint16_t* bits;
  const float* value;
  uint16_t* mine;
  uint16_t* clear;
  bool stream;
};
using OutputKernel = int64_t (*)(const OutputWords& o, int64_t w0, int64_t w1, int64_t at);

// This rank's entries of word w that are in the output: flagged for clearing, counted.
inline int contributed(const OutputWords& o, int64_t w) {
  if (!o.mine) return 0;
  const uint16_t both = o.mine[w] & o.bits[w];
  o.mine[w] = 0;
  o.clear[w] |= both;
  return __builtin_popcount(both);
}

// ---- Scalar: the definition.

template <bool kAccumulate, bool kFlags>
int64_t select_scalar(const SelectSource& src, int64_t begin, int64_t end, float lo, int32_t* index, float* value) {
  const float* grad = src.grad;
  float* residual = src.residual;
  uint16_t* flags = src.clear_bits;
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) {
    float a = grad[i];
    if constexpr (kAccumulate) {
      float r = residual[i];
      if constexpr (kFlags) {
        const uint16_t bit = static_cast<uint16_t>(1u << (i & 15));
        if (flags[i >> 4] & bit) r = 0.f;
        flags[i >> 4] &= static_cast<uint16_t>(~bit);
      }
      a += r;
      residual[i] = a;
    }
    index[count] = static_cast<int32_t>(i);
    value[count] = a;
    count += std::fabs(a) >= lo;
  }
  return count;
}

inline int64_t output_scalar(const OutputWords& o, int64_t w0, int64_t w1, int64_t at) {
  int64_t common = 0;
  for (int64_t w = w0; w < w1; ++w) {
    for (int j = 0; j < 16; ++j) o.dst[16 * w + j] = (o.bits[w] >> j & 1u) ? o.value[at++] : 0.f;
    common += contributed(o, w);
    o.bits[w] = 0;
  }
  return common;
}

#if defined(TRAINER_SELECT_X86)

// ---- AVX-512 (F is all it uses): compress and expand are single instructions on 16 lanes.

template <bool kAccumulate, bool kFlags>
__attribute__((target("avx512f,popcnt"))) int64_t select_avx512(const SelectSource& src, int64_t begin, int64_t end,
                                                                float lo, int32_t* index, float* value) {
  // Locals, not src's fields: vector stores may alias anything, so the fields would be reloaded.
  const float* grad = src.grad;
  float* residual = src.residual;
  uint16_t* flags = src.clear_bits;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 vlo = _mm512_set1_ps(lo);
  int64_t count = 0, i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 a = _mm512_loadu_ps(grad + i);
    if constexpr (kAccumulate) {
      __m512 r;
      if constexpr (kFlags) {
        r = _mm512_maskz_loadu_ps(static_cast<__mmask16>(~flags[i >> 4]), residual + i);
        flags[i >> 4] = 0;
      } else {
        r = _mm512_loadu_ps(residual + i);
      }
      a = _mm512_add_ps(a, r);
      _mm512_storeu_ps(residual + i, a);
    }
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(a), vlo, _CMP_GE_OQ);
    _mm512_storeu_ps(value + count, _mm512_maskz_compress_ps(m, a));
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)), iota);
    _mm512_storeu_si512(index + count, _mm512_maskz_compress_epi32(m, idx));
    count += __builtin_popcount(m);
  }
  return count + select_scalar<kAccumulate, kFlags>(src, i, end, lo, index + count, value + count);
}

__attribute__((target("avx512f,popcnt"))) inline int64_t output_avx512(const OutputWords& o, int64_t w0, int64_t w1,
                                                                       int64_t at) {
  float* dst = o.dst;  // locals: see select_avx512
  uint16_t* bits = o.bits;
  const float* value = o.value;
  const bool stream = o.stream;
  int64_t common = 0;
  for (int64_t w = w0; w < w1; ++w) {
    const __mmask16 m = bits[w];
    common += contributed(o, w);
    bits[w] = 0;
    const __m512 v = _mm512_maskz_expand_ps(m, _mm512_loadu_ps(value + at));
    at += __builtin_popcount(m);
    if (stream)
      _mm512_stream_ps(dst + 16 * w, v);
    else
      _mm512_storeu_ps(dst + 16 * w, v);
  }
  _mm_sfence();
  return common;
}

// ---- AVX2: 8 lanes, compress and expand as a permutation looked up by the 8-bit lane mask.

// Lane tables: entry m (an 8-bit lane mask) holds 8 byte-sized lane numbers for vpermps, which
// reads only the low 3 bits of each. 2 KiB each, so they stay in L1.
// kCompress: the lanes set in m in order (then zeros), so the permutation moves the selected lanes
// to the front; the lane numbers are also the selected entries' offsets, which gives their indices
// without permuting an index vector.
// kExpand: in each lane set in m, how many set lanes precede it, so the permutation spreads
// consecutive values onto the set lanes; 0x80 in the other lanes, so the same vector, sign-extended,
// is also the blend mask that zeroes them (one table load instead of building a mask from m).
constexpr std::array<uint64_t, 256> make_lane_table(bool compress) {
  std::array<uint64_t, 256> table{};
  for (int m = 0; m < 256; ++m) {
    uint64_t entry = 0;
    int set = 0;
    for (int lane = 0; lane < 8; ++lane) {
      const bool in_m = m >> lane & 1;
      if (compress && in_m) entry |= static_cast<uint64_t>(lane) << (8 * set);
      if (!compress) entry |= static_cast<uint64_t>(in_m ? set : 0x80) << (8 * lane);
      set += in_m;
    }
    table[m] = entry;
  }
  return table;
}
inline constexpr std::array<uint64_t, 256> kCompress = make_lane_table(true);
inline constexpr std::array<uint64_t, 256> kExpand = make_lane_table(false);

__attribute__((target("avx2"))) inline __m128i table_entry(const std::array<uint64_t, 256>& table, uint32_t m) {
  return _mm_cvtsi64_si128(static_cast<int64_t>(table[m]));
}

// All-ones in the lanes whose bit is set in the low 8 bits of m (the flags' lanes).
__attribute__((target("avx2"))) inline __m256 lanes_of(uint32_t m) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i bits = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(m)), lane_bit);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(bits, lane_bit));
}

// 16 entries (one flag word) per iteration, as two 8-lane halves.
template <bool kAccumulate, bool kFlags>
__attribute__((target("avx2,popcnt"))) int64_t select_avx2(const SelectSource& src, int64_t begin, int64_t end,
                                                           float lo, int32_t* index, float* value) {
  const float* grad = src.grad;  // locals: see select_avx512
  float* residual = src.residual;
  uint16_t* flags = src.clear_bits;
  const __m256 vlo = _mm256_set1_ps(lo);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t count = 0, i = begin;
  for (; i + 16 <= end; i += 16) {
    uint32_t cleared = 0;
    if constexpr (kFlags) {
      cleared = flags[i >> 4];
      flags[i >> 4] = 0;
    }
    for (int half = 0; half < 2; ++half) {
      const int64_t j = i + 8 * half;
      __m256 a = _mm256_loadu_ps(grad + j);
      if constexpr (kAccumulate) {
        __m256 r = _mm256_loadu_ps(residual + j);
        if constexpr (kFlags) r = _mm256_andnot_ps(lanes_of(cleared >> (8 * half)), r);  // +0.f where flagged
        a = _mm256_add_ps(a, r);
        _mm256_storeu_ps(residual + j, a);
      }
      const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(a, abs_mask), vlo, _CMP_GE_OQ));
      const __m256i lanes = _mm256_cvtepu8_epi32(table_entry(kCompress, m));
      _mm256_storeu_ps(value + count, _mm256_permutevar8x32_ps(a, lanes));
      const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(j)), lanes);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(index + count), idx);
      count += __builtin_popcount(m);
    }
  }
  return count + select_scalar<kAccumulate, kFlags>(src, i, end, lo, index + count, value + count);
}

__attribute__((target("avx2,popcnt"))) inline int64_t output_avx2(const OutputWords& o, int64_t w0, int64_t w1,
                                                                  int64_t at) {
  float* dst = o.dst;  // locals: see select_avx512
  uint16_t* bits = o.bits;
  const float* value = o.value;
  const bool stream = o.stream;
  int64_t common = 0;
  for (int64_t w = w0; w < w1; ++w) {
    const uint32_t m = bits[w];
    common += contributed(o, w);
    bits[w] = 0;
    for (int half = 0; half < 2; ++half) {
      const uint32_t h = m >> (8 * half) & 0xffu;
      const __m256i lanes = _mm256_cvtepi8_epi32(table_entry(kExpand, h));  // sign set: not in h
      const __m256 spread = _mm256_permutevar8x32_ps(_mm256_loadu_ps(value + at), lanes);
      const __m256 v = _mm256_blendv_ps(spread, _mm256_setzero_ps(), _mm256_castsi256_ps(lanes));
      at += __builtin_popcount(h);
      if (stream)
        _mm256_stream_ps(dst + 16 * w + 8 * half, v);
      else
        _mm256_storeu_ps(dst + 16 * w + 8 * half, v);
    }
  }
  _mm_sfence();
  return common;
}

#endif  // TRAINER_SELECT_X86

// The version of each loop for `isa` (scalar for all of them where this is not x86-64).
template <bool kAccumulate, bool kFlags>
SelectKernel select_kernel(Isa isa) {
#if defined(TRAINER_SELECT_X86)
  if (isa == Isa::avx512) return select_avx512<kAccumulate, kFlags>;
  if (isa == Isa::avx2) return select_avx2<kAccumulate, kFlags>;
#endif
  return select_scalar<kAccumulate, kFlags>;
}

inline SelectKernel select_kernel(Isa isa, const SelectSource& src) {
  if (!src.residual) return select_kernel<false, false>(isa);
  if (src.clear_bits) return select_kernel<true, true>(isa);
  return select_kernel<true, false>(isa);
}

inline OutputKernel output_kernel(Isa isa) {
#if defined(TRAINER_SELECT_X86)
  if (isa == Isa::avx512) return output_avx512;
  if (isa == Isa::avx2) return output_avx2;
#endif
  return output_scalar;
}

}  // namespace trainer::comm::select_kernels
