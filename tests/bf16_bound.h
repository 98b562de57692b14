// bf16's error bound, shared by the CPU's and the GPU's precision tests (precision_test.cpp,
// cuda_precision_test.cpp): exact products in double and the check against them.
//
// The bound tested. An output element is a k-term dot product y = sum_i a_i b_i of fp32 inputs.
// The bf16 op rounds each a_i and b_i to bf16 (8 significant bits, round to nearest: relative
// error <= u = 2^-8), multiplies exactly (8 x 8 bits fit fp32's 24) and accumulates in fp32 in
// some order (relative error <= k * 2^-24 of the sum of magnitudes). So
//     |y_bf16 - y| <= (2u + u^2 + k * 2^-24) * sum_i |a_i| |b_i|,
// with y and the sum of magnitudes computed in double from the fp32 inputs. Where the op also
// rounds its result to bf16 once (cuDNN's bf16 convolutions write bf16), that adds at most
// u |y_bf16| <= u (1 + 3u) sum_i |a_i| |b_i|. The check also requires an error of at least u / 16 of
// that sum somewhere: an op that skipped the rounding (ran in fp32) would fail it.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "models/backend.h"

namespace trainer::bf16_testing {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff

// bf16 from its definition, for the checks of the ops that round (written apart from the
// implementations: models/cpu/bf16.h, models/cuda/bf16.cu): the nearer of the two bf16 neighbours
// of x, the even one on a tie; NaN stays a quiet NaN.
inline uint16_t reference_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t down = bits & 0xffff0000u, rest = bits & 0xffffu;
  uint32_t chosen = down;
  if (rest > 0x8000u || (rest == 0x8000u && (down >> 16) & 1u)) chosen = down + 0x10000u;
  return static_cast<uint16_t>(chosen >> 16);
}
inline float reference_widen(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Exact values (double) and the sums of |a| |b| of the terms of each, with the term count.
struct Exact {
  std::vector<double> value, magnitude;
  int64_t terms = 0;
};

// Checks got against exact within the bound above (with the output rounding when rounded_output);
// returns the largest error relative to the sum of magnitudes. inputs_rounded = false: the inputs
// were bf16 values already, so with an fp32 output nothing needs to have rounded.
inline double check_within_bf16_bound(const char* what, const std::vector<float>& got, const Exact& exact,
                                      bool rounded_output = false, bool inputs_rounded = true) {
  REQUIRE(got.size() == exact.value.size());
  double bound = 2 * kU + kU * kU + exact.terms * std::ldexp(1.0, -24);
  if (rounded_output) bound += kU * (1 + 3 * kU);
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double m = exact.magnitude[i];
    const double err = std::abs(got[i] - exact.value[i]);
    if (!(err <= bound * m + 1e-30)) ++bad;  // a NaN (an output never written) is bad too
    if (m > 0) worst = std::max(worst, err / m);
  }
  INFO(what << ": largest error " << worst << " of sum |a||b| (bound " << bound << ")");
  CHECK(bad == 0);
  // The rounding to bf16 happened (not where every input was bf16 already and the output is fp32).
  if (inputs_rounded || rounded_output) CHECK(worst > kU / 16);
  return worst;
}

// A convolution's forward (with the bias when the geometry has one), input gradient and weight
// gradient, exact, for NCHW x and dy and OIHW w.
struct ExactConv {
  Exact y, dx, dw;
};
inline ExactConv exact_conv(const models::ConvGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& b, const std::vector<float>& dy) {
  const int64_t N = g.batch, C = g.in_channels, H = g.in_h, W = g.in_w, K = g.out_channels;
  const int64_t R = g.kernel_h, S = g.kernel_w, P = g.out_h(), Q = g.out_w();
  ExactConv e{{std::vector<double>(N * K * P * Q), std::vector<double>(N * K * P * Q), C * R * S + 1},
              {std::vector<double>(x.size()), std::vector<double>(x.size()), K * R * S},
              {std::vector<double>(w.size()), std::vector<double>(w.size()), N * P * Q}};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t yi = ((n * K + k) * P + p) * Q + q;
          if (g.bias) e.y.value[yi] += b[k], e.y.magnitude[yi] += std::abs(b[k]);
          for (int64_t c = 0; c < C; ++c)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t s = 0; s < S; ++s) {
                const int64_t ih = p * g.stride_h - g.pad_h + r, iw = q * g.stride_w - g.pad_w + s;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t xi = ((n * C + c) * H + ih) * W + iw, wi = ((k * C + c) * R + r) * S + s;
                e.y.value[yi] += double(x[xi]) * w[wi], e.y.magnitude[yi] += std::abs(double(x[xi]) * w[wi]);
                e.dx.value[xi] += double(dy[yi]) * w[wi], e.dx.magnitude[xi] += std::abs(double(dy[yi]) * w[wi]);
                e.dw.value[wi] += double(dy[yi]) * x[xi], e.dw.magnitude[wi] += std::abs(double(dy[yi]) * x[xi]);
              }
        }
  return e;
}

// One row-major GEMM case (Backend::gemm's arguments) and its exact result C = alpha op(A) op(B) + beta C0.
struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  int64_t lda() const { return ta ? m : k; }
  int64_t ldb() const { return tb ? k : n; }
};
inline Exact exact_gemm(const GemmCase& t, const std::vector<float>& a, const std::vector<float>& b,
                        const std::vector<float>& c0) {
  Exact c{std::vector<double>(t.m * t.n), std::vector<double>(t.m * t.n), t.k + 1};
  const int64_t lda = t.lda(), ldb = t.ldb();
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double v = double(t.beta) * c0[i * t.n + j], m = std::abs(v);
      for (int64_t l = 0; l < t.k; ++l) {
        const double p =
            double(t.alpha) * (t.ta ? a[l * lda + i] : a[i * lda + l]) * (t.tb ? b[j * ldb + l] : b[l * ldb + j]);
        v += p, m += std::abs(p);
      }
      c.value[i * t.n + j] = v, c.magnitude[i * t.n + j] = m;
    }
  return c;
}

// A training step in bf16 against the fp32 step: the losses within 1e-2 relative, the gradients'
// cosine above min_cosine, and the two gradients not equal (the bf16 step did round). `what` names it.
inline void check_bf16_step_close(const std::string& what, double loss16, double loss32, const std::vector<float>& g16,
                                  const std::vector<float>& g32, double min_cosine) {
  REQUIRE(g16.size() == g32.size());
  double dot = 0, n16 = 0, n32 = 0, diff = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    dot += double(g16[i]) * g32[i], n16 += double(g16[i]) * g16[i], n32 += double(g32[i]) * g32[i];
    diff += std::abs(double(g16[i]) - g32[i]);
  }
  const double cosine = dot / std::sqrt(n16 * n32);
  INFO(what << ": loss bf16 " << loss16 << " fp32 " << loss32 << ", gradient cosine " << cosine);
  CHECK(std::abs(loss16 - loss32) <= 1e-2 * std::abs(loss32));
  CHECK(cosine > min_cosine);
  CHECK(diff > 0);
}

// Linear's three products (forward with the bias preset and beta 1, weight and input gradients),
// and one with alpha and beta other than 1 and both operands transposed.
inline std::vector<GemmCase> gemm_cases() {
  return {{false, true, 32, 10, 64, 1.f, 1.f},
          {true, false, 10, 64, 32, 1.f, 0.f},
          {false, false, 32, 64, 10, 1.f, 0.f},
          {true, true, 17, 33, 70, 0.5f, 2.f}};
}

}  // namespace trainer::bf16_testing
