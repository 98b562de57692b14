#include "comm/quantized_allreduce.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "comm/float_bits.h"
#include "comm/wire_format.h"

namespace trainer::comm {

namespace {

constexpr float kFp8Max = 448.f;   // E4M3's largest finite value, 1.75 * 2^8
constexpr float kInt8Max = 127.f;  // symmetric int8
constexpr uint32_t kFp8MaxBits = 0x43e00000u;   // 448.f
constexpr uint32_t kFp8MinNormalBits = 0x3c800000u;  // 2^-6
constexpr uint32_t kTwoTo14Bits = 0x46800000u;  // 16384.f, whose last bit is worth 2^-9

// Branch free so that the array loops vectorize (the ternaries become selects). The magnitude is
// first saturated at 448 (Inf too). Below 2^-6 (E4M3's subnormals and zero) adding 2^14 makes the
// float's last bit worth 2^-9, the subnormal step, so the FPU's round-to-nearest-even rounds and
// the low bits of the sum count the steps (8 steps is 2^-6, the smallest normal's code 0x08, so a
// round up into the normals is right too). Above, the exponent is rebiased (127 -> 7: minus 120 << 23)
// and the 20 low bits are rounded away to nearest even; a carry into the exponent is right, and
// nothing at or below 448 rounds past 448's code 0x7e.
inline uint8_t e4m3_from(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = std::min(b & 0x7fffffffu, kFp8MaxBits);  // as integers: the same order as floats
  const uint32_t small = bits_of(float_of(a) + 16384.f) - kTwoTo14Bits;
  const uint32_t normal = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  const uint32_t code = a < kFp8MinNormalBits ? small : normal;
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint8_t>(sign | (nan ? 0x7fu : code));
}

// Exact: a normal code is a float with the exponent rebiased (7 -> 127) and the 3 mantissa bits on
// top; a subnormal one is m 2^-9 (m < 8, exact in a float). The choice is made with bit masks rather
// than ternaries: GCC will not turn a ternary with a floating-point multiply in one arm into a select
// (the multiply could trap, -ftrapping-math), and the loops stayed scalar: `trainer bench outer`'s fp8
// work on this rank took 178 ms instead of 46 (27.5M floats, P = 2).
inline float e4m3_to(uint8_t q) {
  const uint32_t code = q, magnitude_code = code & 0x7fu;
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t normal = (magnitude_code << 20) + (120u << 23);
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(code & 0x7u)) * 0x1p-9f);
  const uint32_t is_normal = 0u - static_cast<uint32_t>(magnitude_code >= 0x08u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude_code == 0x7fu);
  const uint32_t magnitude = (normal & is_normal) | (subnormal & ~is_normal);
  return float_of(sign | (0x7fc00000u & is_nan) | (magnitude & ~is_nan));
}

// nearbyint rounds ties to even in the default rounding mode; NaN compares false both ways and is
// mapped to 0 last.
inline int8_t int8_from(float x) {
  const float clamped = x > kInt8Max ? kInt8Max : (x < -kInt8Max ? -kInt8Max : x);
  return static_cast<int8_t>(x == x ? static_cast<int>(std::nearbyint(clamped)) : 0);
}

inline float bf16_to(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }  // wire_format's

float qmax_of(OuterDType dtype) { return dtype == OuterDType::kFP8 ? kFp8Max : kInt8Max; }

// From this many blocks (2^16 elements) a loop runs on all threads; below, on the caller's alone (as
// in wire_format.cpp: small buffers are not worth a parallel region).
constexpr int64_t kParallelFromBlocks = (int64_t(1) << 16) / kQuantBlock;

// The block's largest |x| as float bits: for non-negative floats integer order is float order, and
// NaN's patterns lie above Inf's, so one integer max finds the max and any NaN or Inf alike.
inline uint32_t max_abs_bits(const float* x, int64_t count) {
  uint32_t m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < count; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    m = std::max(m, b & 0x7fffffffu);
  }
  return m;
}

// A chunk on the wire: `blocks` scales (fp8, int8), then `blocks` x kQuantBlock payload elements.
// The loops are templates on the format, so that each inner loop is one straight conversion.
template <OuterDType D>
struct Chunk {
  using Code = std::conditional_t<D == OuterDType::kBF16, uint16_t, std::conditional_t<D == OuterDType::kFP8, uint8_t, int8_t>>;
  Chunk(uint8_t* chunk, int64_t blocks)
      : scales(reinterpret_cast<float*>(chunk)), payload(reinterpret_cast<Code*>(chunk + blocks * outer_scale_bytes(D))) {}
  float* scales;
  Code* payload;
  float scale(int64_t block) const { return D == OuterDType::kBF16 ? 1.f : scales[block]; }
  static float decode(Code q) {
    if constexpr (D == OuterDType::kBF16) return bf16_to(q);
    else if constexpr (D == OuterDType::kFP8) return e4m3_to(q);
    else return static_cast<float>(q);
  }
};

// Quantizes x[0, count) as `blocks` blocks into `chunk` (elements past count are zeros, and blocks
// wholly past it have scale 0).
template <OuterDType D>
void encode_chunk(const float* x, int64_t count, int64_t blocks, uint8_t* chunk) {
  const Chunk<D> c(chunk, blocks);
  using Code = typename Chunk<D>::Code;
  if constexpr (D == OuterDType::kBF16) {
    // No scales: the chunk is one run of bf16, wire_format.h's cast (threaded for large runs).
    if (count > 0) narrow(WireDType::kBF16, x, count, 1.f, c.payload);
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
    const BlockScale s = block_scale(D, float_of(max_abs_bits(in, valid)));
    c.scales[k] = s.scale;
    const float inverse = s.inverse;
#pragma omp simd
    for (int64_t i = 0; i < valid; ++i) {
      if constexpr (D == OuterDType::kFP8) out[i] = e4m3_from(in[i] * inverse);
      else out[i] = int8_from(in[i] * inverse);
    }
  }
}

// The owner's sum: acc[i] = fma(decode(q_r,i), s_r, acc) over the P received chunks in rank order.
template <OuterDType D>
void sum_chunks(uint8_t* received, int64_t chunk_bytes, int world_size, int64_t blocks, float* acc) {
#pragma omp parallel for schedule(static) if (blocks >= kParallelFromBlocks)
  for (int64_t k = 0; k < blocks; ++k) {
    float* out = acc + k * kQuantBlock;
    std::fill(out, out + kQuantBlock, 0.f);
    for (int r = 0; r < world_size; ++r) {
      const Chunk<D> c(received + r * chunk_bytes, blocks);
      const float s = c.scale(k);
      const auto* q = c.payload + k * kQuantBlock;
#pragma omp simd
      for (int64_t i = 0; i < kQuantBlock; ++i) out[i] = std::fma(Chunk<D>::decode(q[i]), s, out[i]);
    }
  }
}

// out[0, count) = decode(q) * s from a chunk of `blocks` blocks.
template <OuterDType D>
void decode_chunk(uint8_t* chunk, int64_t blocks, int64_t count, float* out) {
  const Chunk<D> c(chunk, blocks);
  const int64_t used = (count + kQuantBlock - 1) / kQuantBlock;
#pragma omp parallel for schedule(static) if (used >= kParallelFromBlocks)
  for (int64_t k = 0; k < used; ++k) {
    const float s = c.scale(k);
    const int64_t begin = k * kQuantBlock, valid = std::min(kQuantBlock, count - begin);
    const auto* q = c.payload + begin;
    float* o = out + begin;
#pragma omp simd
    for (int64_t i = 0; i < valid; ++i) o[i] = Chunk<D>::decode(q[i]) * s;
  }
}

// Steps 1-6 of the header for one format.
template <OuterDType D>
void allreduce_chunks(Communicator& comm, float* data, int64_t n, QuantizedScratch& scratch, const char* tag) {
  const int p = comm.size(), rank = comm.rank();
  const QuantizedVolume v = quantized_volume(D, n, p);
  const int64_t blocks = v.chunk_blocks, chunk_elements = blocks * kQuantBlock, bytes = v.chunk_bytes;
  const size_t all = static_cast<size_t>(p * bytes);
  if (scratch.send.size() < all) scratch.send.resize(all);
  if (scratch.recv.size() < all) scratch.recv.resize(all);
  if (static_cast<int64_t>(scratch.sum.size()) < chunk_elements) scratch.sum.resize(static_cast<size_t>(chunk_elements));
  uint8_t* send = scratch.send.data();
  // Chunk j of data: its start (only formed where the chunk holds elements) and its element count.
  auto count = [&](int j) { return std::clamp<int64_t>(n - j * chunk_elements, 0, chunk_elements); };
  auto start = [&](int j) { return count(j) > 0 ? data + j * chunk_elements : data; };

  // 1-2. Every chunk quantized into its slot; slot j goes to rank j, which gets chunk `rank` of all.
  for (int j = 0; j < p; ++j) encode_chunk<D>(start(j), count(j), blocks, send + j * bytes);
  comm.alltoall(send, bytes, scratch.recv.data(), DType::kU8, tag);
  // 3-4. Summed in fp32 in rank order, quantized again into this rank's slot of the gather buffer.
  sum_chunks<D>(scratch.recv.data(), bytes, p, blocks, scratch.sum.data());
  encode_chunk<D>(scratch.sum.data(), chunk_elements, blocks, send + rank * bytes);
  // 5-6. Every rank's reduced chunk to every rank (in place), decoded into data.
  comm.allgather(send + rank * bytes, bytes, send, DType::kU8, tag);
  for (int j = 0; j < p; ++j) decode_chunk<D>(send + j * bytes, blocks, count(j), start(j));
}

}  // namespace

std::string outer_dtype_name(OuterDType dtype) { return outer_dtype_names().at(static_cast<size_t>(dtype)); }

int64_t outer_element_bytes(OuterDType dtype) {
  switch (dtype) {
    case OuterDType::kF32: return 4;
    case OuterDType::kBF16: return 2;
    case OuterDType::kFP8:
    case OuterDType::kInt8: return 1;
  }
  return 4;
}

int64_t outer_scale_bytes(OuterDType dtype) {
  return dtype == OuterDType::kFP8 || dtype == OuterDType::kInt8 ? 4 : 0;
}

QuantizedVolume quantized_volume(OuterDType dtype, int64_t n, int world_size) {
  if (n < 0 || world_size < 1) throw std::invalid_argument("quantized_volume: n must be >= 0 and world_size >= 1");
  QuantizedVolume v;
  if (n == 0) return v;
  if (dtype == OuterDType::kF32) {
    v.bytes_sent = v.bytes_received = 4 * n;
    return v;
  }
  v.blocks = (n + kQuantBlock - 1) / kQuantBlock;
  v.chunk_blocks = (v.blocks + world_size - 1) / world_size;
  v.chunk_bytes = v.chunk_blocks * (outer_scale_bytes(dtype) + kQuantBlock * outer_element_bytes(dtype));
  v.bytes_sent = (world_size - 1) * v.chunk_bytes + v.chunk_bytes;       // alltoall + allgather
  v.bytes_received = (world_size - 1) * v.chunk_bytes * 2;
  return v;
}

uint8_t float_to_e4m3(float x) { return e4m3_from(x); }
float e4m3_to_float(uint8_t q) { return e4m3_to(q); }
int8_t float_to_int8(float x) { return int8_from(x); }

BlockScale block_scale(OuterDType dtype, float max_abs) {
  if (dtype == OuterDType::kF32 || dtype == OuterDType::kBF16) return {};
  if (!std::isfinite(max_abs)) return {std::numeric_limits<float>::quiet_NaN(), 0.f};
  const float qmax = qmax_of(dtype);
  const float scale = max_abs / qmax;
  if (!(scale >= FLT_MIN)) return {0.f, 0.f};
  return {scale, qmax / max_abs};
}

void allreduce_sum_quantized(Communicator& comm, float* data, int64_t n, OuterDType dtype,
                             QuantizedScratch& scratch, const char* tag) {
  if (n < 0) throw std::invalid_argument(std::string("allreduce_sum_quantized ") + tag + ": negative count");
  if (n == 0) return;
  if (dtype == OuterDType::kF32) {
    comm.allreduce(data, n, DType::kF32, ReduceOp::kSum, tag);
    return;
  }
  switch (dtype) {
    case OuterDType::kBF16: return allreduce_chunks<OuterDType::kBF16>(comm, data, n, scratch, tag);
    case OuterDType::kFP8: return allreduce_chunks<OuterDType::kFP8>(comm, data, n, scratch, tag);
    case OuterDType::kInt8: return allreduce_chunks<OuterDType::kInt8>(comm, data, n, scratch, tag);
    case OuterDType::kF32: break;
  }
}

}  // namespace trainer::comm
