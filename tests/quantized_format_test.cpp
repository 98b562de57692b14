// The low-bit formats of the outer-gradient allreduce (comm/quantized_allreduce.h), single process:
// fp8 E4M3 (e4m3fn) against exact values from ml_dtypes 0.5 (float8_e4m3fn) and from the bit
// layout (ties to even, the largest finite, subnormals, NaN, saturation), then the scalar
// conversions against an independent reference that rounds in double with frexp/ldexp/nearbyint
// over millions of float bit patterns; every E4M3 code widened exactly; int8's rounding and
// saturation; the block scale's edge cases; the names. The multi-rank sums, which run the array
// loops against these definitions bit for bit, are in quantized_allreduce_test.cpp.
#include "comm/quantized_allreduce.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

using namespace trainer::comm;

namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// The value of an E4M3 code from the format's definition: bias 7, 3 mantissa bits, exponent field 0
// for subnormals (m 2^-9), S.1111.111 NaN, no Inf.
double reference_e4m3_value(uint8_t q) {
  const double sign = (q & 0x80) ? -1.0 : 1.0;
  const int field = (q >> 3) & 0xf, m = q & 7;
  if (field == 15 && m == 7) return NAN;
  if (field == 0) return sign * std::ldexp(static_cast<double>(m), -9);
  return sign * std::ldexp(1.0 + m / 8.0, field - 7);
}

// The reference rounding of a finite float to E4M3: nearest, ties to even (nearbyint in the default
// rounding mode), saturating at 448. Written from the definition, sharing nothing with the code
// under test; NaN is handled by the callers.
uint8_t reference_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0) return sign;
  int e = 0;
  std::frexp(a, &e);                             // a = m 2^e, m in [0.5, 1)
  const int exponent = std::max(e - 1, -6);      // subnormals share the smallest normal's step
  const double step = std::ldexp(1.0, exponent - 3);
  const double r = std::min(std::nearbyint(a / step) * step, 448.0);  // a / step: exact
  if (r < std::ldexp(1.0, -6)) return sign | static_cast<uint8_t>(r / std::ldexp(1.0, -9));
  std::frexp(r, &e);
  const int E = e - 1;
  const int mantissa = static_cast<int>(r / std::ldexp(1.0, E - 3)) - 8;
  return sign | static_cast<uint8_t>(((E + 7) << 3) | mantissa);
}

// Float patterns to sweep: every 1021st, and around every E4M3 value (20 dropped bits) the patterns
// whose dropped bits are exactly a tie, one below, one above, and all ones.
std::vector<uint32_t> sweep_patterns() {
  std::vector<uint32_t> out;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 1021) out.push_back(static_cast<uint32_t>(b));
  for (int code = 0; code < 256; ++code) {
    const double v = reference_e4m3_value(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    const uint32_t base = bits_of(static_cast<float>(v));
    for (uint32_t low : {0x0u, 0x7ffffu, 0x80000u, 0x80001u, 0xfffffu}) out.push_back((base & ~0xfffffu) | low);
    // The subnormal range's steps (2^-9) are finer than 20 dropped bits of a float below 2^-6: the
    // midpoints between neighbouring codes, and just beside them.
    const float mid = static_cast<float>(v + std::ldexp(1.0, -10));
    out.push_back(bits_of(mid));
    out.push_back(bits_of(mid) + 1);
    out.push_back(bits_of(mid) - 1);
  }
  return out;
}

}  // namespace

TEST_CASE("E4M3: exact values (ml_dtypes' float8_e4m3fn), ties to even, saturation, subnormals", "[quant]") {
  const std::vector<std::pair<float, uint8_t>> cases = {
      {0.0f, 0x00},   {-0.0f, 0x80},  {1.0f, 0x38},     {-3.0f, 0xc4},
      {0.1f, 0x1d},   // 0.1015625
      {0.3f, 0x2a},   // 0.3125
      {240.0f, 0x77},  // 1.875 2^7
      {448.0f, 0x7e},  // the largest finite
      {449.0f, 0x7e},  {463.9f, 0x7e},
      {464.0f, 0x7e},  // halfway to 480, which does not exist: 448 (ml_dtypes agrees)
      // Past 464 ml_dtypes' cast gives NaN; ours saturates (NVIDIA's __NV_SATFINITE conversion), so
      // that no finite value becomes NaN on the wire.
      {1000.0f, 0x7e}, {-1e30f, 0xfe}, {INFINITY, 0x7e}, {-INFINITY, 0xfe},
      {0x1p-6f, 0x08},   // the smallest normal
      {0x1p-9f, 0x01},   // the smallest subnormal
      {0x1p-10f, 0x00},  // halfway between 0 and 2^-9: even 0
      {0x1.000002p-10f, 0x01},  // just above
      {0x1.8p-9f, 0x02},   // 1.5 steps: even 2
      {0x1.4p-8f, 0x02},   // 2.5 steps: even 2
      {0x1.cp-7f, 0x07},   // 7 steps: the largest subnormal
      {0x1.ep-7f, 0x08},   // 7.5 steps: a tie, up to even 8, the smallest normal
      {1.0625f, 0x38},     // 1 + 1/16, halfway between 1 and 1.125: even 1
      {1.1875f, 0x3a},     // 1 + 3/16, halfway between 1.125 and 1.25: even 1.25
      {0x1.100002p0f, 0x39},  // just above 1 + 1/16
      {17.0f, 0x58},       // halfway between 16 and 18: even 16
      {19.0f, 0x5a},       // halfway between 18 and 20: even 20
      {1e-30f, 0x00},      {1e-40f, 0x00},  // far below, and a float subnormal
  };
  for (const auto& [x, want] : cases) {
    INFO("x = " << x);
    CHECK(float_to_e4m3(x) == want);
    CHECK(reference_e4m3(x) == want);  // the reference agrees with the table too
  }
  CHECK(e4m3_to_float(0x7e) == 448.0f);
  CHECK(e4m3_to_float(0xfe) == -448.0f);
  CHECK(e4m3_to_float(0x01) == 0x1p-9f);
  CHECK(e4m3_to_float(0x08) == 0x1p-6f);
  CHECK(e4m3_to_float(0x77) == 240.0f);
  CHECK(std::signbit(e4m3_to_float(0x80)));
  CHECK(e4m3_to_float(0x80) == 0.0f);
}

TEST_CASE("E4M3: NaN stays NaN with its sign, both ways", "[quant]") {
  for (const uint32_t b : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0xff800100u}) {
    INFO("bits = " << std::hex << b);
    const uint8_t q = float_to_e4m3(float_of(b));
    CHECK((q & 0x7f) == 0x7f);
    CHECK((q >> 7) == (b >> 31));
    CHECK(std::isnan(e4m3_to_float(q)));
    CHECK(std::signbit(e4m3_to_float(q)) == static_cast<bool>(b >> 31));
  }
}

TEST_CASE("E4M3: narrowing equals the double reference over millions of float patterns", "[quant]") {
  const auto patterns = sweep_patterns();
  int64_t wrong = 0, nan_wrong = 0;
  uint32_t first_wrong = 0;
  for (const uint32_t b : patterns) {
    const float x = float_of(b);
    const uint8_t q = float_to_e4m3(x);
    if (std::isnan(x)) {
      nan_wrong += (q & 0x7f) != 0x7f;
      continue;
    }
    const bool bad = q != reference_e4m3(x);
    if (bad && !wrong) first_wrong = b;
    wrong += bad;
  }
  INFO(patterns.size() << " patterns; first wrong: 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
  CHECK(nan_wrong == 0);
}

TEST_CASE("E4M3: every code widens exactly and comes back unchanged", "[quant]") {
  int64_t wrong = 0, round_trip = 0, nans = 0;
  for (int code = 0; code < 256; ++code) {
    const uint8_t q = static_cast<uint8_t>(code);
    const float v = e4m3_to_float(q);
    const double want = reference_e4m3_value(q);
    if (std::isnan(want)) {
      nans += std::isnan(v);
      continue;
    }
    wrong += static_cast<double>(v) != want || std::signbit(v) != std::signbit(want);
    round_trip += float_to_e4m3(v) != q;
  }
  CHECK(wrong == 0);
  CHECK(round_trip == 0);
  CHECK(nans == 2);  // 0x7f and 0xff, the only NaNs
}

TEST_CASE("int8: round to nearest even, saturation at +-127, NaN to 0", "[quant]") {
  const std::vector<std::pair<float, int>> cases = {
      {0.f, 0},     {0.49f, 0},    {0.5f, 0},     {0.51f, 1},     {1.5f, 2},     {2.5f, 2},
      {-0.5f, 0},   {-1.5f, -2},   {-2.5f, -2},   {126.5f, 126},  {125.5f, 126}, {127.f, 127},
      {127.4f, 127}, {127.6f, 127}, {200.f, 127}, {-200.f, -127}, {-127.5f, -127}, {1e30f, 127},
      {INFINITY, 127}, {-INFINITY, -127}, {NAN, 0}, {1e-40f, 0},
  };
  for (const auto& [x, want] : cases) {
    INFO("x = " << x);
    CHECK(static_cast<int>(float_to_int8(x)) == want);
  }
  // Against nearbyint in double over a dense sweep of [-130, 130].
  int64_t wrong = 0;
  for (int i = -130 * 64; i <= 130 * 64; ++i) {
    const float x = static_cast<float>(i) / 64.f;
    const double r = std::min(127.0, std::max(-127.0, std::nearbyint(static_cast<double>(x))));
    wrong += static_cast<double>(float_to_int8(x)) != r;
  }
  CHECK(wrong == 0);
}

TEST_CASE("Block scales: max to qmax, zeros and tiny blocks to scale 0, non-finite to NaN", "[quant]") {
  const BlockScale fp8 = block_scale(OuterDType::kFP8, 448.f);
  CHECK(fp8.scale == 1.f);
  CHECK(fp8.inverse == 1.f);
  const BlockScale i8 = block_scale(OuterDType::kInt8, 2.f);
  CHECK(i8.scale == 2.f / 127.f);
  CHECK(i8.inverse == 127.f / 2.f);
  for (const OuterDType d : {OuterDType::kFP8, OuterDType::kInt8}) {
    INFO(outer_dtype_name(d));
    CHECK(block_scale(d, 0.f).scale == 0.f);
    CHECK(block_scale(d, 0.f).inverse == 0.f);
    CHECK(block_scale(d, 1e-37f).scale == 0.f);   // A / qmax would be below FLT_MIN: flushed
    CHECK(block_scale(d, 1e-34f).scale >= FLT_MIN);  // A / qmax above FLT_MIN: kept
    CHECK(std::isfinite(block_scale(d, 1e-34f).inverse));
    CHECK(std::isfinite(block_scale(d, FLT_MAX).scale));
    CHECK(std::isnan(block_scale(d, NAN).scale));
    CHECK(std::isnan(block_scale(d, INFINITY).scale));
    CHECK(block_scale(d, INFINITY).inverse == 0.f);
  }
  CHECK(block_scale(OuterDType::kBF16, 3.f).scale == 1.f);
  CHECK(block_scale(OuterDType::kF32, 3.f).scale == 1.f);
}

TEST_CASE("Outer dtype names parse, sizes, and an unknown name lists the choices", "[quant]") {
  CHECK(parse_outer_dtype("fp32") == OuterDType::kF32);
  CHECK(parse_outer_dtype("bf16") == OuterDType::kBF16);
  CHECK(parse_outer_dtype("fp8") == OuterDType::kFP8);
  CHECK(parse_outer_dtype("int8") == OuterDType::kInt8);
  for (const auto& name : outer_dtype_names()) CHECK(outer_dtype_name(parse_outer_dtype(name)) == name);
  CHECK(outer_element_bytes(OuterDType::kF32) == 4);
  CHECK(outer_element_bytes(OuterDType::kBF16) == 2);
  CHECK(outer_element_bytes(OuterDType::kFP8) == 1);
  CHECK(outer_element_bytes(OuterDType::kInt8) == 1);
  CHECK(outer_scale_bytes(OuterDType::kBF16) == 0);
  CHECK(outer_scale_bytes(OuterDType::kFP8) == 4);
  CHECK_THROWS_WITH(parse_outer_dtype("fp16"), Catch::Matchers::Contains("outer_dtype") &&
                                                   Catch::Matchers::Contains("fp32, bf16, fp8, int8"));
}

TEST_CASE("The volume: padded chunks of whole blocks, scales included", "[quant]") {
  // n = 1000 at P = 3: 4 blocks, chunks of 2 blocks (the third chunk all padding), fp8 chunk
  // 2 (4 + 256) bytes; sent: alltoall 2 chunks + allgather 1; received: 2 + 2.
  const QuantizedVolume v = quantized_volume(OuterDType::kFP8, 1000, 3);
  CHECK(v.blocks == 4);
  CHECK(v.chunk_blocks == 2);
  CHECK(v.chunk_bytes == 520);
  CHECK(v.bytes_sent == 3 * 520);
  CHECK(v.bytes_received == 4 * 520);
  CHECK(quantized_volume(OuterDType::kBF16, 1000, 3).chunk_bytes == 2 * 512);
  CHECK(quantized_volume(OuterDType::kF32, 1000, 3).bytes_sent == 4000);
  CHECK(quantized_volume(OuterDType::kInt8, 1, 1).chunk_bytes == 260);  // one element: one whole block
  CHECK(quantized_volume(OuterDType::kInt8, 0, 4).bytes_sent == 0);
  CHECK_THROWS_AS(quantized_volume(OuterDType::kFP8, -1, 2), std::invalid_argument);
}
