// DeepSpeech: the exact parameter count and names, a smoke step of the full model, parity of a
// tiny one with PyTorch (tests/fixtures/ctc_deepspeech_tiny.safetensors, made by
// scripts/make_speech_fixtures.py), a finite-difference check of the whole small network,
// independence of an utterance's outputs from its batch's padding, and memorization of a few
// utterances (loss near zero, greedy decoding returns the labels).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "models/nets/deepspeech.h"
#include "models/safetensors.h"
#include "speech_testing.h"

using namespace trainer::models;
using trainer::testing::random_vector;

namespace {

using Batch = trainer::testing::SpeechTestBatch;

DeepSpeechOptions tiny() {
  DeepSpeechOptions o;
  o.feature_dim = 8;  // -> 4 -> 2 bins after the convolutions
  o.conv_channels = 2;
  o.hidden = 4;
  o.rnn_layers = 2;
  o.context = 2;
  o.classes = 5;
  return o;
}

}  // namespace

TEST_CASE("deepspeech has 27,569,568 parameters under deepspeech.pytorch's names", "[deepspeech]") {
  auto model = make_speech_model("deepspeech", cpu_backend(), 1);
  ParameterStore& p = model->parameters();
  CHECK(p.size() == 27569568);
  CHECK(p.size() * 4 == 110278272);
  const auto& v = p.views();
  CHECK(v.front().name == "conv.seq_module.0.weight");
  CHECK(v.front().shape == Shape{32, 1, 41, 11});
  CHECK(p.value(p.find("conv.seq_module.3.weight")).shape == Shape{32, 32, 21, 11});
  CHECK(p.value(p.find("rnns.0.rnn.weight_ih_l0")).shape == Shape{3200, 1312});
  CHECK(p.value(p.find("rnns.4.rnn.bias_hh_l0")).shape == Shape{3200});
  CHECK(p.find("rnns.0.batch_norm.module.weight") == -1);  // the first LSTM has no batch norm
  CHECK(p.value(p.find("rnns.1.batch_norm.module.weight")).shape == Shape{800});
  CHECK(p.value(p.find("lookahead.0.weight")).shape == Shape{800, 21});
  CHECK(v.back().name == "fc.0.module.1.weight");
  CHECK(v.back().shape == Shape{29, 800});
  CHECK(model->buffers().find("fc.0.module.0.running_var") >= 0);
  CHECK_THROWS_WITH(make_speech_model("deepspeach", cpu_backend(), 1), Catch::Contains("known: deepspeech"));
}

TEST_CASE("Backend: image <-> sequence reorder and width masks in every layout", "[deepspeech]") {
  // {N, C, H, W} -> {W, N, C*H} with feature c*H + h, as PyTorch's view + permute.
  const int64_t N = 2, C = 32, H = 3, W = 5;
  std::vector<float> nchw(N * C * H * W);
  for (size_t i = 0; i < nchw.size(); ++i) nchw[i] = static_cast<float>(i);
  for (Layout layout : {Layout::kChannelsLast, Layout::kBlocked8, Layout::kBlocked16}) {
    std::vector<float> image(nchw.size()), sequence(nchw.size()), back(nchw.size());
    Tensor x{image.data(), {N, C, H, W}, layout};
    cpu_backend().from_nchw(nchw.data(), x);
    cpu_backend().image_to_sequence(x, sequence.data());
    bool ok = true;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w)
            ok &= sequence[(w * N + n) * C * H + c * H + h] == nchw[((n * C + c) * H + h) * W + w];
    CHECK(ok);
    Tensor y{back.data(), {N, C, H, W}, layout};
    cpu_backend().sequence_to_image(sequence.data(), y);
    CHECK(back == image);
    const std::vector<int32_t> lengths{3, 5};
    cpu_backend().mask_width(y, lengths.data());
    std::vector<float> masked(nchw.size());
    cpu_backend().to_nchw(y, masked.data());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w) {
            const int64_t i = ((n * C + c) * H + h) * W + w;
            ok &= masked[i] == (w < lengths[n] ? nchw[i] : 0.f);
          }
    CHECK(ok);
  }
}

TEST_CASE("deepspeech: one training step on 2 utterances of up to 60 frames", "[deepspeech]") {
  DeepSpeech model(cpu_backend(), DeepSpeechOptions{}, 2);
  CHECK(DeepSpeech::output_frames(60) == 30);
  CHECK(DeepSpeech::output_frames(45) == 23);
  Batch b(161, {60, 45}, {{8, 5, 12, 12, 15}, {20, 28, 9}}, 3);
  const double loss = model.forward(b.input(), Mode::kTrain);
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
  CHECK(model.logits().shape == Shape{30, 2, 29});
  CHECK(model.forward_flops() > 1e9);
  model.backward();
  const ParameterStore& p = model.parameters();
  double norm = 0;
  for (int64_t i = 0; i < p.size(); ++i) norm += double(p.grads()[i]) * p.grads()[i];
  CHECK(std::isfinite(norm));
  CHECK(norm > 0);
  for (const auto& v : p.views()) {  // every tensor receives a gradient
    double sum = 0;
    for (int64_t i = 0; i < v.numel(); ++i) sum += std::fabs(p.grads()[v.offset + i]);
    INFO(v.name);
    CHECK(sum > 0);
  }
}

TEST_CASE("deepspeech matches a PyTorch model of the same structure (tiny sizes)", "[deepspeech][parity]") {
  const auto f = read_safetensors(std::string(TRAINER_FIXTURES) + "/ctc_deepspeech_tiny.safetensors");
  auto ref = [&](const std::string& name) { return f.at("f64." + name).as_f64(); };
  auto check_close = [](const std::string& what, const float* actual, const std::vector<double>& expected) {
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(expected[i]));
      max_diff = std::max(max_diff, std::fabs(actual[i] - expected[i]));
    }
    INFO(what << ": max |difference| " << max_diff << ", max |reference| " << max_ref);
    CHECK(max_diff <= 1e-4 * max_ref);
  };
  auto i32 = [&](const std::string& name) {
    auto v = f.at(name).as_i64();
    return std::vector<int32_t>(v.begin(), v.end());
  };
  DeepSpeech model(cpu_backend(), tiny(), 1);
  ParameterStore& p = model.parameters();
  for (const auto& v : p.views()) {
    auto values = f.at("param." + v.name).as_f32();
    REQUIRE(static_cast<int64_t>(values.size()) == v.numel());
    std::copy(values.begin(), values.end(), p.values() + v.offset);
  }
  const std::vector<float> features = f.at("features").as_f32();
  const auto frames = i32("frames"), labels = i32("labels"), label_lengths = i32("label_lengths");
  const SpeechInput in{features.data(), 2, 14, 8, frames.data(), labels.data(), label_lengths.data()};
  const double loss = model.forward(in, Mode::kTrain);
  CHECK(loss == Approx(ref("loss")[0]).epsilon(1e-4));
  check_close("logits", model.logits().data, ref("logits"));
  model.backward();
  for (const auto& v : p.views()) check_close("grad.param." + v.name, p.grads() + v.offset, ref("grad.param." + v.name));
  for (const auto& v : model.buffers().views())
    check_close("buffer." + v.name, model.buffers().values() + v.offset, ref("buffer." + v.name));
  model.forward(in, Mode::kEval);
  check_close("logits_eval", model.logits().data, ref("logits_eval"));
}

TEST_CASE("deepspeech gradients of a tiny model against finite differences", "[deepspeech][gradcheck]") {
  // Logits are few and the CTC loss smooth; batch norms see 22 frames. The objective is the mean
  // CTC loss itself, computed in float32 by the network and in double by the loss.
  DeepSpeech model(cpu_backend(), tiny(), 4);
  Batch b(8, {14, 10}, {{1, 2, 2}, {3, 4}}, 5);
  trainer::testing::check_model_gradients(model, b.input());
}

TEST_CASE("deepspeech reports each stage's gradients final as backward leaves it (overlap)", "[deepspeech]") {
  DeepSpeech model(cpu_backend(), tiny(), 4);
  Batch a(8, {12, 9}, {{1, 3}, {2}}, 5), b(8, {11, 12}, {{4}, {2, 1}}, 6);
  // fc, its batch norm, the lookahead, 2 LSTMs and 1 sequence batch norm, 2 convolutions and 2 batch norms.
  trainer::testing::check_gradient_reports(model, a.input(), b.input(), 10);
}

TEST_CASE("deepspeech: an utterance's outputs do not depend on the padding of its batch", "[deepspeech]") {
  // Evaluation mode (running statistics): the short utterance alone and beside a longer one.
  DeepSpeechOptions o = tiny();
  o.hidden = 6;
  DeepSpeech model(cpu_backend(), o, 6);
  Batch pair(8, {24, 15}, {{1}, {2}}, 7);
  Batch alone(8, {15}, {{2}}, 8);
  std::copy_n(pair.features.begin() + 24 * 8, 15 * 8, alone.features.begin());
  model.forward(pair.input(), Mode::kEval);
  const int64_t steps = model.logits().dim(0);
  std::vector<float> in_pair;
  for (int64_t t = 0; t < DeepSpeech::output_frames(15); ++t)
    for (int64_t c = 0; c < 5; ++c) in_pair.push_back(model.logits().data[(t * 2 + 1) * 5 + c]);
  CHECK(steps == DeepSpeech::output_frames(24));
  model.forward(alone.input(), Mode::kEval);
  REQUIRE(model.logits().numel() == static_cast<int64_t>(in_pair.size()));
  for (size_t i = 0; i < in_pair.size(); ++i) CHECK(model.logits().data[i] == Approx(in_pair[i]).margin(1e-5));
}

TEST_CASE("deepspeech memorizes 4 utterances: CTC loss near zero, greedy decoding = labels", "[deepspeech]") {
  DeepSpeechOptions o;
  o.feature_dim = 16;
  o.conv_channels = 8;
  o.hidden = 48;
  o.rnn_layers = 2;
  o.context = 4;
  DeepSpeech model(cpu_backend(), o, 9);
  const std::vector<std::vector<int32_t>> targets{{8, 5, 12, 12, 15}, {23, 15, 18}, {4, 1, 28, 2}, {19, 9, 24}};
  Batch b(16, {40, 36, 31, 28}, targets, 10);
  trainer::testing::train_until(model, b.input(), 1e-2, 0.02, 400);
  // Running statistics catch up with the final weights, then evaluation-mode decoding.
  for (int i = 0; i < 30; ++i) model.forward(b.input(), Mode::kTrain);
  CHECK(model.decode(b.input()) == targets);
}
