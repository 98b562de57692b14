// Listen-Attend-Spell: the an4 configuration's parameter count and names, a finite-difference check
// of a tiny model's whole loss (listener, pyramid, attention, speller, label smoothing), the
// determinism of teacher forcing, beam search of width 1 = greedy, batch independence of decoding,
// clear errors, and memorization of a few utterances. Parity with PyTorch: las_parity_test.cpp.
#include <catch2/catch.hpp>

#include "models/nets/las.h"
#include "speech_testing.h"

using namespace trainer::models;
using trainer::testing::SpeechTestBatch;

using trainer::testing::tiny_las_options;

TEST_CASE("las (an4 sizes) has 27,468,449 parameters in PyTorch's module order", "[las]") {
  auto model = make_speech_model("las", cpu_backend(), 1);
  ParameterStore& p = model->parameters();
  CHECK(p.size() == 27468449);
  const auto& v = p.views();
  REQUIRE(v.size() == 4 * 2 * 4 + 2 * 2 + 1 + 2 * 4 + 2);
  CHECK(v.front().name == "listener.blstm.weight_ih_l0");
  CHECK(v.front().shape == Shape{4 * 384, 80});
  CHECK(p.views()[p.find("listener.pblstm.2.weight_ih_l0_reverse")].shape == Shape{4 * 384, 4 * 384});
  CHECK(p.views()[p.find("attention.key.weight")].shape == Shape{512, 768});
  CHECK(p.views()[p.find("speller.embedding.weight")].shape == Shape{33, 256});
  CHECK(p.views()[p.find("speller.cells.0.weight_ih")].shape == Shape{4 * 640, 256 + 768});
  CHECK(v.back().name == "speller.output.bias");
}

TEST_CASE("las gradients of a tiny model against finite differences", "[las][gradcheck]") {
  Las model(cpu_backend(), tiny_las_options(), 3);
  // Frame counts 17, 12, 9 -> listener lengths 4, 3, 2; transcripts of 3, 1 and 2 characters.
  SpeechTestBatch b(6, {17, 12, 9}, {{2, 5, 28}, {7}, {1, 9}}, 4);
  trainer::testing::check_model_gradients(model, b.input(), 1e-2, 8);
}

TEST_CASE("las reports its gradients final as backward leaves each part (overlap)", "[las]") {
  Las model(cpu_backend(), tiny_las_options(), 3);
  SpeechTestBatch a(6, {17, 12, 9}, {{2, 5, 28}, {7}, {1, 9}}, 4), b(6, {16, 13, 9}, {{3, 3}, {8, 1}, {9}}, 5);
  // The output layer, the speller, the attention, 2 pyramid layers and the first BLSTM.
  trainer::testing::check_gradient_reports(model, a.input(), b.input(), 6);
}

TEST_CASE("las teacher forcing: the draws follow the batch seed", "[las]") {
  LasOptions o = tiny_las_options();
  o.teacher_forcing = 0.5;
  Las model(cpu_backend(), o, 3);
  SpeechTestBatch b(6, {17, 12, 9}, {{2, 5, 28, 3, 3}, {7, 8, 9}, {1, 9}}, 4);
  SpeechInput in = b.input();
  in.seed = 11;
  const double a = model.forward(in, Mode::kTrain);
  CHECK(model.forward(in, Mode::kTrain) == a);
  // Some seed makes a different choice somewhere (the untrained argmax is rarely the label).
  bool differs = false;
  for (uint64_t seed = 12; seed < 20 && !differs; ++seed) {
    in.seed = seed;
    differs = model.forward(in, Mode::kTrain) != a;
  }
  CHECK(differs);
  // Evaluation always teacher-forces: the seed does not matter.
  in.seed = 1;
  const double e = model.forward(in, Mode::kEval);
  in.seed = 2;
  CHECK(model.forward(in, Mode::kEval) == e);
}

TEST_CASE("las decoding: beam width 1 is greedy, and an utterance decodes alike alone or in a batch", "[las]") {
  LasOptions o = tiny_las_options();
  o.max_decode_steps = 12;
  Las model(cpu_backend(), o, 5);
  SpeechTestBatch b(6, {20, 13, 8}, {{1}, {2}, {3}}, 6);
  const auto greedy = model.decode_greedy(b.input());
  CHECK(model.decode_beam(b.input(), 1) == greedy);
  for (const auto& h : greedy) CHECK(h.size() <= 12);
  const auto beam = model.decode_beam(b.input(), 4);
  REQUIRE(beam.size() == 3);
  // The second utterance alone: its features are the batch's second row block.
  SpeechTestBatch alone(6, {13}, {{2}}, 6);
  std::copy_n(b.features.begin() + 1 * b.max_frames * 6, 13 * 6, alone.features.begin());
  CHECK(model.decode_beam(alone.input(), 4)[0] == beam[1]);
  CHECK(model.decode_greedy(alone.input())[0] == greedy[1]);
}

TEST_CASE("las rejects utterances too short for its pyramid and wrong feature sizes", "[las]") {
  Las model(cpu_backend(), tiny_las_options(), 5);  // 2 pyramid layers: at least 4 frames
  SpeechTestBatch short_one(6, {8, 3}, {{1}, {2}}, 1);
  CHECK_THROWS_WITH(model.forward(short_one.input(), Mode::kTrain),
                    Catch::Contains("utterance 1 has 3 frames") && Catch::Contains("between 4 and 8"));
  SpeechTestBatch wrong_dim(5, {8}, {{1}}, 1);
  CHECK_THROWS_WITH(model.forward(wrong_dim.input(), Mode::kTrain), Catch::Contains("{N, T, 6}"));
}

TEST_CASE("las memorizes 4 utterances: greedy and beam decoding return the transcripts", "[las]") {
  LasOptions o;
  o.feature_dim = 16;
  o.listener_hidden = 32;
  o.pyramid_layers = 2;
  o.attention_dim = 32;
  o.embedding_dim = 16;
  o.speller_hidden = 48;
  o.speller_layers = 1;
  o.max_decode_steps = 20;
  Las model(cpu_backend(), o, 9);
  const std::vector<std::vector<int32_t>> targets{{8, 5, 12, 12, 15}, {23, 15, 18}, {4, 1, 28, 2}, {19, 9, 24}};
  SpeechTestBatch b(16, {40, 36, 31, 28}, targets, 10);
  trainer::testing::train_until(model, b.input(), 1e-2, 0.01, 300);
  CHECK(model.decode_greedy(b.input()) == targets);
  CHECK(model.decode_beam(b.input(), 3) == targets);
}

TEST_CASE("las: the weights streamed per time step are the listener's recurrences and the speller's", "[las]") {
  const LasOptions o = tiny_las_options();
  Las model(cpu_backend(), o, 3);
  SpeechTestBatch b(6, {17, 12, 9}, {{2, 5, 28}, {7}, {1, 9}}, 4);
  model.forward(b.input(), Mode::kTrain);
  const auto streamed = model.streamed_weights();
  // Both directions of the BLSTM and of each pyramid layer, then the speller's products.
  REQUIRE(streamed.size() == size_t(2 * (1 + o.pyramid_layers) + 1));
  for (size_t i = 0; i + 1 < streamed.size(); ++i) CHECK(streamed[i].working_set == 4 * o.listener_hidden * o.listener_hidden);
  const auto& speller = streamed.back();
  CHECK(speller.rows == 3);
  // Forward reads the speller's working set once per step (4 steps: the longest transcript + <eos>)
  // and backward all of it but the output layer once more.
  CHECK(speller.reads > 4.0 * speller.working_set);
  CHECK(speller.reads < 8.0 * speller.working_set);
  // Their FLOPs are a part of the step's (3 x forward: forward, and backward's two products).
  double flops = 0;
  for (const auto& w : streamed) flops += 2.0 * w.rows * w.reads;
  CHECK(flops > 0);
  CHECK(flops <= 3 * model.forward_flops());
}
