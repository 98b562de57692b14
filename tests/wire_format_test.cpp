// The 16-bit wire formats' conversions (comm/wire_format.h), single process: exact values from
// NumPy (fp16) and from the bit layout (bf16), ties to even, NaN, Inf, fp16 overflow and
// subnormals; then the scalar conversions against an independent reference that rounds in double
// with frexp/ldexp/nearbyint over millions of float bit patterns, the array loops (F16C where the
// build has it) against the scalar ones bit for bit, the fused scale, and the reduction's add
// against the exact sum rounded once. The multi-rank sums are in wire_sync_test.cpp.
#include "comm/wire_format.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
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

// A binary format with `mantissa` stored bits, minimum normal exponent `emin`, maximum `emax`.
struct Format {
  int mantissa, emin, emax;
};
constexpr Format kBf16{7, -126, 127};
constexpr Format kFp16{10, -14, 15};

// The reference rounding: v (any double whose significand fits 53 bits, which every fp32 value and
// every sum of two 16-bit values does) to the nearest value of the format, ties to even (nearbyint
// in the default rounding mode), encoded. Written from the definition, sharing nothing with the
// code under test. NaN is handled by the callers.
uint16_t reference_round(double v, Format f) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  int e = 0;
  std::frexp(a, &e);                               // a = m 2^e, m in [0.5, 1)
  const int exponent = std::max(e - 1, f.emin);    // subnormals share emin's step
  const double step = std::ldexp(1.0, exponent - f.mantissa);
  const double r = std::nearbyint(a / step) * step;  // a / step is exact: a power-of-two scaling
  const int exponent_field_bits = f.mantissa == 7 ? 8 : 5;
  const uint16_t inf = static_cast<uint16_t>(((1 << exponent_field_bits) - 1) << f.mantissa);
  if (r >= std::ldexp(1.0, f.emax + 1)) return sign | inf;
  if (r < std::ldexp(1.0, f.emin)) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, f.emin - f.mantissa));
  std::frexp(r, &e);
  const int E = e - 1;
  const double significand = r / std::ldexp(1.0, E - f.mantissa) - std::ldexp(1.0, f.mantissa);
  const int bias = (1 << (exponent_field_bits - 1)) - 1;
  return sign | static_cast<uint16_t>(((E + bias) << f.mantissa) | static_cast<int>(significand));
}

// The reference value of a 16-bit pattern.
double reference_value(uint16_t h, Format f) {
  const int exponent_field_bits = f.mantissa == 7 ? 8 : 5;
  const int bias = (1 << (exponent_field_bits - 1)) - 1;
  const int field = (h >> f.mantissa) & ((1 << exponent_field_bits) - 1);
  const int m = h & ((1 << f.mantissa) - 1);
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (field == (1 << exponent_field_bits) - 1) return m ? NAN : s * INFINITY;
  if (field == 0) return s * std::ldexp(static_cast<double>(m), f.emin - f.mantissa);
  return s * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mantissa), field - bias);
}

bool is_nan16(uint16_t h, Format f) { return std::isnan(reference_value(h, f)); }

// Float bit patterns to sweep: every 1021st pattern, and around every value the formats can hold,
// the patterns whose dropped bits are exactly a tie, one below and one above, and all ones.
std::vector<uint32_t> sweep_patterns() {
  std::vector<uint32_t> out;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 1021) out.push_back(static_cast<uint32_t>(b));
  for (uint32_t high = 0; high < (1u << 19); ++high) {  // every fp16 neighbourhood: 13 dropped bits
    const uint32_t base = high << 13;
    for (uint32_t low : {0x0u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) out.push_back(base | low);
  }
  for (uint32_t high = 0; high < (1u << 16); ++high) {  // every bf16 neighbourhood: 16 dropped bits
    const uint32_t base = high << 16;
    for (uint32_t low : {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) out.push_back(base | low);
  }
  return out;
}

}  // namespace

TEST_CASE("fp16: exact values from NumPy (ties to even, overflow, subnormals)", "[wire]") {
  // float32 -> numpy.float16 bit patterns (NumPy 1.24, astype), comments are NumPy's values.
  const std::vector<std::pair<float, uint16_t>> cases = {
      {0.0f, 0x0000},           {-0.0f, 0x8000},          {1.0f, 0x3c00},          {-2.0f, 0xc000},
      {0.1f, 0x2e66},           // 0.0999755859375
      {1.0f / 3, 0x3555},       // 0.333251953125
      {3.14159265f, 0x4248},    // 3.140625
      {-123.456f, 0xd7b7},      // -123.4375
      {65504.0f, 0x7bff},       // the largest finite
      {65519.99f, 0x7bff},      // below the halfway point to 2^16: 65504
      {65520.0f, 0x7c00},       // the halfway point rounds to even, which is Inf
      {-65520.0f, 0xfc00},      {1e5f, 0x7c00},
      {2049.0f, 0x6800},        // tie between 2048 and 2050: even 2048
      {2051.0f, 0x6802},        // tie between 2050 and 2052: even 2052
      {0x1p-14f, 0x0400},       // the smallest normal
      {0x1p-24f, 0x0001},       // the smallest subnormal
      {0x1p-25f, 0x0000},       // tie between 0 and 2^-24: even 0
      {0x1.000002p-25f, 0x0001},  // just above that tie
      {0x1.8p-24f, 0x0002},     // 1.5 steps: even 2
      {0x1.4p-23f, 0x0002},     // 2.5 steps: even 2
      {0x1.ff8p-15f, 0x03ff},   // the largest subnormal, 1023 steps
      {0x1.ffcp-15f, 0x0400},   // 1023.5 steps: a tie, up to even 1024, the smallest normal
      {0x1.ffbffep-15f, 0x03ff},  // just below that tie
      {1e-7f, 0x0002},          {3e-8f, 0x0001},          {1e-8f, 0x0000},
      {1e-40f, 0x0000},         // a float subnormal
      {0x1.002p0f, 0x3c00},     // 1 + 2^-11, a tie: even 1
      {0x1.006p0f, 0x3c02},     // 1 + 3 2^-11, a tie: even 1 + 2^-9
      {0x1.002002p0f, 0x3c01},  // just above the tie
  };
  for (const auto& [x, want] : cases) {
    INFO("x = " << x);
    CHECK(float_to_fp16(x) == want);
    uint16_t array = 0;
    narrow(WireDType::kF16, &x, 1, 1.f, &array);
    CHECK(array == want);
    if (!std::isinf(fp16_to_float(want))) CHECK(static_cast<double>(fp16_to_float(want)) == reference_value(want, kFp16));
  }
  CHECK(float_to_fp16(INFINITY) == 0x7c00);
  CHECK(float_to_fp16(-INFINITY) == 0xfc00);
  CHECK(std::isinf(fp16_to_float(0x7c00)));
  CHECK(fp16_to_float(0xfc00) < 0);
  CHECK(std::signbit(fp16_to_float(0x8000)));
  CHECK(fp16_to_float(0x0001) == 0x1p-24f);
}

TEST_CASE("bf16: exact values from the bit layout", "[wire]") {
  // bf16 is the high half of a float: the result is the high half rounded by the low half.
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3f800000, 0x3f80},  // 1
      {0x3f808000, 0x3f80},  // 1 + 2^-8: a tie, even (low bit 0) stays
      {0x3f818000, 0x3f82},  // 1 + 3 2^-8: a tie, the odd 0x3f81 goes up to even
      {0x3f808001, 0x3f81},  // just above the tie
      {0x3f807fff, 0x3f80},  // just below
      {0xbf818000, 0xbf82},  // negative: the same in magnitude
      {0x7f7f7fff, 0x7f7f},  // near the largest float, below the tie: finite
      {0x7f7fffff, 0x7f80},  // the largest float rounds to Inf, as round-to-nearest says
      {0x7f800000, 0x7f80},  // Inf
      {0xff800000, 0xff80},  // -Inf
      {0x00000000, 0x0000},  {0x80000000, 0x8000},  // zeros keep their sign
      {0x00008000, 0x0000},  // float subnormals: a tie at the smallest step, even 0
      {0x00018000, 0x0002},  // 1.5 steps: even 2
      {0x00010001, 0x0001},  // just above a step
      {0x007fffff, 0x0080},  // the largest float subnormal rounds up to the smallest normal
  };
  for (const auto& [b, want] : cases) {
    INFO("bits = " << std::hex << b);
    const float x = float_of(b);
    CHECK(float_to_bf16(x) == want);
    uint16_t array = 0;
    narrow(WireDType::kBF16, &x, 1, 1.f, &array);
    CHECK(array == want);
    CHECK(bits_of(bf16_to_float(want)) == static_cast<uint32_t>(want) << 16);
  }
}

TEST_CASE("NaN stays NaN, with its sign, in both formats and both directions", "[wire]") {
  for (const uint32_t b : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0xff800100u}) {
    INFO("bits = " << std::hex << b);
    const float x = float_of(b);
    const uint16_t h = float_to_fp16(x), g = float_to_bf16(x);
    CHECK(is_nan16(h, kFp16));
    CHECK(is_nan16(g, kBf16));
    CHECK((h >> 15) == (b >> 31));
    CHECK((g >> 15) == (b >> 31));
    CHECK(std::isnan(fp16_to_float(h)));
    CHECK(std::isnan(bf16_to_float(g)));
  }
  CHECK(std::isnan(fp16_to_float(0x7c01)));  // a signaling fp16 NaN
  CHECK(std::isnan(bf16_to_float(0x7f81)));
}

TEST_CASE("Narrowing equals the double reference over millions of float patterns", "[wire]") {
  const auto patterns = sweep_patterns();
  std::vector<float> x(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) x[i] = float_of(patterns[i]);
  std::vector<uint16_t> h(x.size()), g(x.size());
  narrow(WireDType::kF16, x.data(), static_cast<int64_t>(x.size()), 1.f, h.data());
  narrow(WireDType::kBF16, x.data(), static_cast<int64_t>(x.size()), 1.f, g.data());
  int64_t wrong_fp16 = 0, wrong_bf16 = 0, array_fp16 = 0, array_bf16 = 0;
  uint32_t first_wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t s16 = float_to_fp16(x[i]), sb = float_to_bf16(x[i]);
    array_fp16 += s16 != h[i];
    array_bf16 += sb != g[i];
    if (std::isnan(x[i])) {
      wrong_fp16 += !is_nan16(s16, kFp16);
      wrong_bf16 += !is_nan16(sb, kBf16);
      continue;
    }
    const bool bad16 = s16 != reference_round(x[i], kFp16), badb = sb != reference_round(x[i], kBf16);
    if ((bad16 || badb) && !first_wrong) first_wrong = patterns[i];
    wrong_fp16 += bad16;
    wrong_bf16 += badb;
  }
  INFO(patterns.size() << " patterns; first wrong: 0x" << std::hex << first_wrong);
  CHECK(wrong_fp16 == 0);
  CHECK(wrong_bf16 == 0);
  CHECK(array_fp16 == 0);  // the vector loop (F16C where built with it) is the scalar definition
  CHECK(array_bf16 == 0);
}

TEST_CASE("Widening is exact for every 16-bit pattern, the array loops equal the scalar ones", "[wire]") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> h(all.size()), g(all.size());
  widen(WireDType::kF16, all.data(), 65536, h.data());
  widen(WireDType::kBF16, all.data(), 65536, g.data());
  int64_t wrong = 0, array = 0, round_trip = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t p = static_cast<uint16_t>(i);
    const float a = fp16_to_float(p), b = bf16_to_float(p);
    array += bits_of(a) != bits_of(h[i]) || bits_of(b) != bits_of(g[i]);
    const double ra = reference_value(p, kFp16), rb = reference_value(p, kBf16);
    wrong += std::isnan(ra) ? !std::isnan(a) : (static_cast<double>(a) != ra || std::signbit(a) != std::signbit(ra));
    wrong += std::isnan(rb) ? !std::isnan(b) : (static_cast<double>(b) != rb || std::signbit(b) != std::signbit(rb));
    // Every non-NaN pattern survives the trip out and back.
    if (!std::isnan(ra)) round_trip += float_to_fp16(a) != p;
    if (!std::isnan(rb)) round_trip += float_to_bf16(b) != p;
  }
  CHECK(wrong == 0);
  CHECK(array == 0);
  CHECK(round_trip == 0);
}

TEST_CASE("The scale is fused into the cast: round(x * scale), one rounding of the product", "[wire]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 100.f);
  std::vector<float> x(10007);  // not a multiple of any vector width
  for (auto& v : x) v = normal(rng);
  for (const float scale : {1.f / 3, 0.25f, 1.f}) {
    std::vector<uint16_t> h(x.size()), g(x.size());
    narrow(WireDType::kF16, x.data(), static_cast<int64_t>(x.size()), scale, h.data());
    narrow(WireDType::kBF16, x.data(), static_cast<int64_t>(x.size()), scale, g.data());
    int64_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i)
      wrong += h[i] != float_to_fp16(x[i] * scale) || g[i] != float_to_bf16(x[i] * scale);
    CHECK(wrong == 0);
  }
  CHECK_THROWS_AS(narrow(WireDType::kF32, x.data(), 1, 1.f, nullptr), std::invalid_argument);
}

TEST_CASE("The reduction's add is the exact sum of two 16-bit numbers rounded once", "[wire]") {
  std::mt19937 rng(9);
  for (const auto& [wire, format] : {std::pair{WireDType::kF16, kFp16}, std::pair{WireDType::kBF16, kBf16}}) {
    // Random finite patterns (all magnitudes, subnormals included), and pairs far apart in size.
    std::vector<uint16_t> a, b;
    while (a.size() < 200000) {
      const uint16_t x = static_cast<uint16_t>(rng()), y = static_cast<uint16_t>(rng());
      if (std::isfinite(reference_value(x, format)) && std::isfinite(reference_value(y, format)))
        a.push_back(x), b.push_back(y);
    }
    std::vector<uint16_t> sum = b;
    wire_add(wire, a.data(), sum.data(), static_cast<int64_t>(a.size()));
    int64_t wrong = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double exact = reference_value(a[i], format) + reference_value(b[i], format);  // exact in double
      wrong += sum[i] != reference_round(exact, format);  // a zero's sign too: IEEE's rule in both
    }
    INFO(wire_dtype_name(wire));
    CHECK(wrong == 0);
  }
}

TEST_CASE("Wire format names parse, and an unknown one names the choices", "[wire]") {
  CHECK(parse_wire_dtype("fp32") == WireDType::kF32);
  CHECK(parse_wire_dtype("bf16") == WireDType::kBF16);
  CHECK(parse_wire_dtype("fp16") == WireDType::kF16);
  for (const auto& name : wire_dtype_names()) CHECK(wire_dtype_name(parse_wire_dtype(name)) == name);
  CHECK(wire_bytes(WireDType::kF32) == 4);
  CHECK(wire_bytes(WireDType::kBF16) == 2);
  CHECK(wire_bytes(WireDType::kF16) == 2);
  CHECK(dtype_size(wire_comm_dtype(WireDType::kBF16)) == 2);
  CHECK(dtype_size(wire_comm_dtype(WireDType::kF16)) == 2);
  CHECK_THROWS_WITH(parse_wire_dtype("half"), Catch::Matchers::Contains("fp32, bf16, fp16"));
}
