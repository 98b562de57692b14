// Listen-Attend-Spell against PyTorch: a tiny model (tests/fixtures/las_tiny.safetensors, made by
// scripts/make_las_fixtures.py from the torch.nn model in scripts/torch_speech_models.py) with the
// fixture's weights gives the same loss, logits and every parameter gradient on a batch of unsorted
// lengths with junk in the padding frames, the same greedy decoding, and the an4 sizes give the
// parameter count of the PyTorch model at its defaults.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "models/nets/las.h"
#include "models/safetensors.h"
#include "speech_testing.h"

using namespace trainer::models;

namespace {

const SafeTensorsFile& fixture() {
  static const SafeTensorsFile f = read_safetensors(std::string(TRAINER_FIXTURES) + "/las_tiny.safetensors");
  return f;
}

std::vector<int32_t> i32(const std::string& name) {
  const auto v = fixture().at(name).as_i64();
  return std::vector<int32_t>(v.begin(), v.end());
}


// max |actual - expected| against 1e-4 x max |expected| over the entries where `use` says so (all
// when empty); the float64 PyTorch result is the truth.
void check_close(const std::string& what, const float* actual, const std::vector<double>& expected,
                 const std::vector<char>& use = {}) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!use.empty() && !use[i]) continue;
    max_ref = std::max(max_ref, std::fabs(expected[i]));
    max_diff = std::max(max_diff, std::fabs(actual[i] - expected[i]));
  }
  INFO(what << ": max |difference| " << max_diff << ", max |reference| " << max_ref);
  CHECK(max_ref > 0);
  CHECK(max_diff <= 1e-4 * max_ref);
}

// The fixture's batch: features {3, 17, 6} with junk past each utterance's frames.
struct FixtureBatch {
  std::vector<float> features = fixture().at("features").as_f32();
  std::vector<int32_t> frames = i32("frames"), labels = i32("labels"), label_lengths = i32("label_lengths");
  SpeechInput input() const {
    const auto& shape = fixture().at("features").shape;
    return {features.data(), shape[0], shape[1], shape[2], frames.data(), labels.data(), label_lengths.data()};
  }
};

void load_parameters(Las& model, const std::string& prefix = "") {
  ParameterStore& p = model.parameters();
  for (const auto& v : p.views()) {
    const auto values = fixture().at(prefix + "param." + v.name).as_f32();
    REQUIRE(static_cast<int64_t>(values.size()) == v.numel());
    std::copy(values.begin(), values.end(), p.values() + v.offset);
  }
}

// The fixture's greedy transcripts: <prefix>tokens (concatenated) and <prefix>lengths.
std::vector<std::vector<int32_t>> expected_decode(const std::string& prefix) {
  const auto tokens = i32(prefix + "tokens"), lengths = i32(prefix + "lengths");
  std::vector<std::vector<int32_t>> expected;
  for (size_t n = 0, at = 0; n < lengths.size(); at += lengths[n++])
    expected.emplace_back(tokens.begin() + at, tokens.begin() + at + lengths[n]);
  return expected;
}

}  // namespace

TEST_CASE("las parameters: the names and order of the PyTorch model", "[las][parity]") {
  Las model(cpu_backend(), trainer::testing::tiny_las_options(), 1);
  std::vector<std::string> names;
  for (const auto& v : model.parameters().views()) {
    names.push_back(v.name);
    INFO(v.name);
    CHECK(fixture().at("param." + v.name).shape == v.shape);
  }
  std::vector<std::string> torch_names;
  std::stringstream order(fixture().metadata.at("parameter_order"));
  for (std::string name; std::getline(order, name, ',');) torch_names.push_back(name);
  CHECK(names == torch_names);
}

TEST_CASE("las matches PyTorch: loss, logits and every gradient (tiny sizes, label smoothing 0.1)",
          "[las][parity]") {
  Las model(cpu_backend(), trainer::testing::tiny_las_options(), 1);
  load_parameters(model);
  const FixtureBatch b;
  const SpeechInput in = b.input();
  auto ref = [](const std::string& name) { return fixture().at("f64." + name).as_f64(); };

  const double loss = model.forward(in, Mode::kTrain);
  CHECK(loss == Approx(ref("loss")[0]).epsilon(1e-4));
  CHECK(model.listener_lengths() == i32("listener_lengths"));
  // Logits {U, N, 33}: rows past an utterance's transcript and <eos> are not part of the loss.
  const Tensor logits = model.logits();
  const auto& shape = fixture().at("f64.logits").shape;
  REQUIRE(logits.shape == Shape(shape.begin(), shape.end()));
  const int64_t U = shape[0], N = shape[1], V = shape[2];
  std::vector<char> valid(U * N * V, 0);
  for (int64_t u = 0; u < U; ++u)
    for (int64_t n = 0; n < N; ++n)
      if (u <= b.label_lengths[n]) std::fill_n(valid.begin() + (u * N + n) * V, V, 1);
  check_close("logits", logits.data, ref("logits"), valid);

  model.backward();
  const ParameterStore& p = model.parameters();
  for (const auto& v : p.views()) check_close("grad.param." + v.name, p.grads() + v.offset, ref("grad.param." + v.name));

  // An evaluation forward teacher-forces too: the same loss and logits.
  CHECK(model.forward(in, Mode::kEval) == Approx(ref("loss")[0]).epsilon(1e-4));
  check_close("logits (evaluation forward)", model.logits().data, ref("logits"), valid);
}

TEST_CASE("las greedy decoding matches PyTorch's (untrained tiny model, 8 steps)", "[las][parity]") {
  LasOptions o = trainer::testing::tiny_las_options();
  o.max_decode_steps = 8;
  Las model(cpu_backend(), o, 1);
  load_parameters(model);
  CHECK(model.decode_greedy(FixtureBatch().input()) == expected_decode("greedy_"));
}

TEST_CASE("las greedy decoding stops at the first argmax <eos>, as PyTorch's", "[las][parity]") {
  // Utterance 2's argmax is <eos> after 7 tokens, narrowly: greedy decoding ends there.
  LasOptions o = trainer::testing::tiny_las_options();
  o.max_decode_steps = 12;
  Las model(cpu_backend(), o, 1);
  load_parameters(model, "greedy_eos.");
  const auto expected = expected_decode("greedy_eos_");
  REQUIRE(expected[2].size() == 7);
  CHECK(model.decode_greedy(FixtureBatch().input()) == expected);
}

TEST_CASE("las an4 sizes: 27,468,449 parameters, as the PyTorch model at its defaults", "[las][parity]") {
  Las model(cpu_backend(), LasOptions{}, 1);
  CHECK(model.parameters().size() == 27468449);
  CHECK(std::stoll(fixture().metadata.at("default_parameters")) == model.parameters().size());
}
