// CTC loss: parity with torch.nn.functional.ctc_loss (tests/fixtures/ctc_loss.safetensors, made by
// scripts/make_speech_fixtures.py), a finite-difference gradient check, the infeasible case, and
// greedy decoding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "models/layers/ctc_loss.h"
#include "models/safetensors.h"

using namespace trainer::models;
using trainer::testing::random_vector;

namespace {

std::vector<int32_t> i32(const SafeTensor& t) {
  auto v = t.as_i64();
  return std::vector<int32_t>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("CTC loss matches torch.nn.functional.ctc_loss (reduction='sum' / N)", "[ctc][parity]") {
  const auto f = read_safetensors(std::string(TRAINER_FIXTURES) + "/ctc_loss.safetensors");
  std::vector<float> logits = f.at("logits").as_f32();
  const auto frames = i32(f.at("frames")), labels = i32(f.at("labels")), lengths = i32(f.at("label_lengths"));
  CtcLoss ctc(cpu_backend());
  const double loss = ctc.forward(Tensor{logits.data(), f.at("logits").shape}, frames.data(), labels.data(),
                                  lengths.data(), true);
  CHECK(loss == Approx(f.at("f64.loss").as_f64()[0]).epsilon(1e-5));
  const auto losses = f.at("f64.losses").as_f64();
  for (size_t n = 0; n < losses.size(); ++n) CHECK(ctc.losses()[n] == Approx(losses[n]).epsilon(1e-5));
  const auto grad = f.at("f64.grad.logits").as_f64();
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(grad[i]));
    max_diff = std::max(max_diff, std::fabs(ctc.backward().data[i] - grad[i]));
  }
  INFO("max |difference| " << max_diff << ", max |reference| " << max_ref);
  CHECK(max_diff <= 1e-4 * max_ref);
}

TEST_CASE("CTC loss gradient against finite differences", "[ctc][gradcheck]") {
  const int64_t T = 8, N = 3, C = 5;
  std::vector<float> logits = random_vector(T * N * C, 1, 1.5f);
  const std::vector<int32_t> frames{8, 6, 4}, labels{1, 2, 2, 3, 4, 4, 1}, lengths{4, 1, 2};
  CtcLoss ctc(cpu_backend());
  const Tensor z{logits.data(), {T, N, C}};
  ctc.forward(z, frames.data(), labels.data(), lengths.data(), true);
  std::vector<float> analytic(ctc.backward().data, ctc.backward().data + T * N * C);
  const double h = 1e-2;
  for (int64_t i = 0; i < T * N * C; ++i) {
    const float saved = logits[i];
    logits[i] = static_cast<float>(saved + h);
    const double plus = ctc.forward(z, frames.data(), labels.data(), lengths.data(), false);
    logits[i] = static_cast<float>(saved - h);
    const double minus = ctc.forward(z, frames.data(), labels.data(), lengths.data(), false);
    logits[i] = saved;
    const double numeric = (plus - minus) / (2 * h);
    INFO("logit " << i << ": analytic " << analytic[i] << " numeric " << numeric);
    CHECK(std::fabs(analytic[i] - numeric) <= 1e-4 + 1e-3 * std::fabs(numeric));
  }
}

TEST_CASE("CTC loss: labels that cannot fit give an infinite loss and no gradient", "[ctc]") {
  // "1 1" needs three frames (a blank between the repeats); two are not enough.
  std::vector<float> logits = random_vector(2 * 1 * 3, 2);
  const std::vector<int32_t> frames{2}, labels{1, 1}, lengths{2};
  CtcLoss ctc(cpu_backend());
  const double loss = ctc.forward(Tensor{logits.data(), {2, 1, 3}}, frames.data(), labels.data(), lengths.data(), true);
  CHECK(std::isinf(loss));
  for (int i = 0; i < 6; ++i) CHECK(ctc.backward().data[i] == 0.f);
  CHECK_THROWS_WITH(ctc.forward(Tensor{logits.data(), {2, 1, 3}}, frames.data(), std::vector<int32_t>{0, 1}.data(),
                                lengths.data(), false),
                    Catch::Contains("0 is the blank"));
}

TEST_CASE("Greedy CTC decoding collapses repeats, then drops blanks", "[ctc]") {
  // Frame argmaxes for utterance 0: 1 1 0 1 2 2 0 -> "1 1 2"; utterance 1 (3 frames): 0 3 3 -> "3".
  const int64_t T = 7, N = 2, C = 4;
  const int best[2][7] = {{1, 1, 0, 1, 2, 2, 0}, {0, 3, 3, 1, 1, 1, 1}};
  std::vector<float> logits(T * N * C, 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) logits[(t * N + n) * C + best[n][t]] = 1.f;
  const std::vector<int32_t> frames{7, 3};
  const auto decoded = ctc_greedy_decode(Tensor{logits.data(), {T, N, C}}, frames.data());
  CHECK(decoded[0] == std::vector<int32_t>{1, 1, 2});
  CHECK(decoded[1] == std::vector<int32_t>{3});
}
