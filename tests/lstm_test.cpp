// The sequence layers: LSTM (both CPU implementations, both directions, stacked, variable
// lengths), sequence-wise batch norm, lookahead convolution and Hardtanh. Gradient checks against
// finite differences (gradcheck.h), and torch.nn.LSTM parity on a packed batch from
// tests/fixtures/lstm_bidir.safetensors (scripts/make_speech_fixtures.py).
#include <algorithm>
#include <cmath>

#include "gradcheck.h"
#include "models/layers/hardtanh.h"
#include "models/layers/lookahead.h"
#include "models/layers/lstm.h"
#include "models/layers/sequence_batch_norm.h"
#include "models/safetensors.h"

using namespace trainer::models;
using namespace trainer::testing;

namespace {

void randomize(LayerHarness& h, uint64_t seed, float scale = 0.5f) {
  h.params.allocate(h.ctx.backend);
  h.buffers.allocate(h.ctx.backend);
  auto v = random_vector(h.params.size(), seed, scale);
  std::copy(v.begin(), v.end(), h.params.values());
}

// The CPU backend whose LSTMs are `algorithm`'s.
Backend& cpu_with(LstmAlgorithm algorithm) {
  BackendSettings settings;
  settings.lstm_algorithm = algorithm;
  return cpu_backend(settings);
}

// Runs `body(backend)` once on a CPU backend of each LSTM implementation.
template <class Body>
void with_each_lstm(Body&& body) {
  for (auto algorithm : {LstmAlgorithm::kDnnl, LstmAlgorithm::kGemm}) {
    DYNAMIC_SECTION((algorithm == LstmAlgorithm::kDnnl ? "oneDNN" : "GEMM")) { body(cpu_with(algorithm)); }
  }
}

void check_close(const std::string& what, const float* actual, const std::vector<double>& expected,
                 double rtol = 1e-4) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(expected[i]));
    max_diff = std::max(max_diff, std::fabs(actual[i] - expected[i]));
  }
  INFO(what << ": max |difference| " << max_diff << ", max |reference| " << max_ref);
  CHECK(max_diff <= rtol * max_ref);
}

}  // namespace

TEST_CASE("LSTM gradients: stacked, unidirectional, variable lengths", "[lstm][gradcheck]") {
  with_each_lstm([](Backend& backend) {
    LayerHarness h(backend);
    Lstm lstm(h.ctx, "rnn", {4, 3, 2, false});
    randomize(h, 1);
    lstm.set_lengths({5, 3, 1});
    check_layer_gradients(lstm, h, {5, 3, 4}, random_vector(5 * 3 * 4, 2));
  });
}

TEST_CASE("LSTM gradients: stacked, bidirectional, variable lengths", "[lstm][gradcheck]") {
  with_each_lstm([](Backend& backend) {
    LayerHarness h(backend);
    Lstm lstm(h.ctx, "rnn", {3, 3, 2, true});
    randomize(h, 3);
    lstm.set_lengths({2, 6, 4});
    check_layer_gradients(lstm, h, {6, 3, 3}, random_vector(6 * 3 * 3, 4));
  });
}

TEST_CASE("LSTM: outputs past each length are zero, padding input is never read", "[lstm]") {
  with_each_lstm([](Backend& backend) {
    LayerHarness h(backend);
    Lstm lstm(h.ctx, "rnn", {2, 3, 1, true});
    randomize(h, 5);
    const std::vector<int32_t> lengths{4, 2};
    std::vector<float> x = random_vector(4 * 2 * 2, 6);
    lstm.set_lengths(lengths);
    const Tensor& y1 = lstm.forward(Tensor{x.data(), {4, 2, 2}}, Mode::kTrain);
    std::vector<float> first(y1.data, y1.data + y1.numel());
    for (int t = 2; t < 4; ++t)
      for (int c = 0; c < 6; ++c) CHECK(first[(t * 2 + 1) * 6 + c] == 0.f);
    for (int t = 2; t < 4; ++t) x[(t * 2 + 1) * 2] = 100.f;  // junk in sequence 1's padding
    const Tensor& y2 = lstm.forward(Tensor{x.data(), {4, 2, 2}}, Mode::kTrain);
    CHECK(std::equal(first.begin(), first.end(), y2.data));
    // A sequence's output does not depend on the batch it is in (the reverse direction starts at
    // its own last step): sequence 1 alone, two steps long.
    std::vector<float> alone{x[2], x[3], x[6], x[7]};
    lstm.set_lengths({});
    const Tensor& y3 = lstm.forward(Tensor{alone.data(), {2, 1, 2}}, Mode::kTrain);
    for (int t = 0; t < 2; ++t)
      for (int c = 0; c < 6; ++c) CHECK(y3.data[t * 6 + c] == Approx(first[(t * 2 + 1) * 6 + c]).margin(1e-6));
  });
}

TEST_CASE("LSTM: the oneDNN and GEMM implementations agree", "[lstm]") {
  const Shape shape{9, 4, 20};
  const std::vector<int32_t> lengths{9, 7, 3, 8};
  std::vector<float> x = random_vector(numel(shape), 7);
  std::vector<float> dy = random_vector(9 * 4 * 32, 8);
  std::vector<float> y[2], dx[2], dparams[2];
  int index = 0;
  for (auto algorithm : {LstmAlgorithm::kDnnl, LstmAlgorithm::kGemm}) {
    LayerHarness h(cpu_with(algorithm));
    Lstm lstm(h.ctx, "rnn", {20, 16, 2, true});
    randomize(h, 9, 0.3f);
    lstm.set_lengths(lengths);
    const Tensor& out = lstm.forward(Tensor{x.data(), shape}, Mode::kTrain);
    y[index].assign(out.data, out.data + out.numel());
    const Tensor& g = lstm.backward(Tensor{dy.data(), out.shape});
    dx[index].assign(g.data, g.data + g.numel());
    dparams[index].assign(h.params.grads(), h.params.grads() + h.params.size());
    ++index;
  }
  auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(double(a[i])));
      max_diff = std::max(max_diff, std::fabs(double(a[i]) - b[i]));
    }
    return max_diff <= 1e-5 * max_ref;
  };
  CHECK(close(y[0], y[1]));
  CHECK(close(dx[0], dx[1]));
  CHECK(close(dparams[0], dparams[1]));
}

TEST_CASE("LstmOp (the backend's whole LSTM): padding of x and dy does not matter, y and dx are zero there",
          "[lstm]") {
  with_each_lstm([](Backend& backend) {
    const LstmGeometry g{4, 5, 2, true};
    const int64_t T = 6, N = 3, I = 4, H = 5, pairs = 4;
    const std::vector<int32_t> lengths{4, 6, 1};
    std::vector<std::vector<float>> params[4], grads[2][4];
    LstmWeights w;
    LstmGradients dw[2];
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t sizes[4] = {4 * H * g.layer_input(i / 2), 4 * H * H, 4 * H, 4 * H};
      for (int k = 0; k < 4; ++k) {
        params[k].push_back(random_vector(sizes[k], 20 + 4 * i + k, 0.4f));
        for (auto& run : grads) run[k].emplace_back(sizes[k]);
      }
    }
    for (int64_t i = 0; i < pairs; ++i) {
      w.w_ih.push_back(params[0][i].data()), w.w_hh.push_back(params[1][i].data());
      w.b_ih.push_back(params[2][i].data()), w.b_hh.push_back(params[3][i].data());
      for (int r = 0; r < 2; ++r) {
        dw[r].w_ih.push_back(grads[r][0][i].data()), dw[r].w_hh.push_back(grads[r][1][i].data());
        dw[r].b_ih.push_back(grads[r][2][i].data()), dw[r].b_hh.push_back(grads[r][3][i].data());
      }
    }
    auto op = backend.make_lstm(g);
    std::vector<float> x[2], dy[2], y[2], dx[2];
    for (int r = 0; r < 2; ++r) {
      x[r] = random_vector(T * N * I, 30);
      dy[r] = random_vector(T * N * 2 * H, 31);
      y[r].assign(T * N * 2 * H, 7.f);
      dx[r].assign(T * N * I, 7.f);
    }
    // Run 1: finite junk in every padding row of x and dy.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n)
        if (t >= lengths[n]) {
          for (int64_t c = 0; c < I; ++c) x[1][(t * N + n) * I + c] = 9.f;
          for (int64_t c = 0; c < 2 * H; ++c) dy[1][(t * N + n) * 2 * H + c] = -9.f;
        }
    for (int r = 0; r < 2; ++r) {
      op->forward(T, N, x[r].data(), lengths.data(), w, y[r].data(), true);
      op->backward(T, N, x[r].data(), lengths.data(), w, y[r].data(), dy[r].data(), dx[r].data(), dw[r]);
    }
    CHECK(y[0] == y[1]);
    CHECK(dx[0] == dx[1]);
    for (int k = 0; k < 4; ++k) CHECK(grads[0][k] == grads[1][k]);
    for (int64_t i = 0; i < pairs; ++i) CHECK(grads[0][2][i] == grads[0][3][i]);  // b_ih and b_hh
    int64_t nonzero = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n)
        if (t >= lengths[n]) {
          for (int64_t c = 0; c < 2 * H; ++c) nonzero += y[0][(t * N + n) * 2 * H + c] != 0.f;
          for (int64_t c = 0; c < I; ++c) nonzero += dx[0][(t * N + n) * I + c] != 0.f;
        }
    CHECK(nonzero == 0);
  });
}

TEST_CASE("LSTM matches torch.nn.LSTM on a packed batch (2 layers, bidirectional)", "[lstm][parity]") {
  const auto f = read_safetensors(std::string(TRAINER_FIXTURES) + "/lstm_bidir.safetensors");
  auto ref = [&](const std::string& name) { return f.at("f64." + name).as_f64(); };
  with_each_lstm([&](Backend& backend) {
    LayerHarness h(backend);
    Lstm lstm(h.ctx, "rnn", {5, 4, 2, true});
    h.params.allocate(h.ctx.backend);
    h.buffers.allocate(h.ctx.backend);
    REQUIRE(h.params.size() == 2 * (4 * 4 * (5 + 4) + 8 * 4) + 2 * (4 * 4 * (8 + 4) + 8 * 4));
    for (const auto& v : h.params.views()) {
      auto values = f.at("param." + v.name.substr(4)).as_f32();  // "rnn." + PyTorch name
      REQUIRE(static_cast<int64_t>(values.size()) == v.numel());
      std::copy(values.begin(), values.end(), h.params.values() + v.offset);
    }
    std::vector<float> x = f.at("input").as_f32();
    auto lengths64 = f.at("lengths").as_i64();
    lstm.set_lengths(std::vector<int32_t>(lengths64.begin(), lengths64.end()));
    const Tensor& y = lstm.forward(Tensor{x.data(), f.at("input").shape}, Mode::kTrain);
    check_close("output", y.data, ref("output"));
    std::vector<float> w = f.at("objective_weight").as_f32();
    const Tensor& dx = lstm.backward(Tensor{w.data(), y.shape});
    check_close("grad.input", dx.data, ref("grad.input"));
    for (const auto& v : h.params.views())
      check_close("grad.param." + v.name, h.params.grads() + v.offset, ref("grad.param." + v.name.substr(4)));
  });
}

TEST_CASE("Sequence-wise batch norm gradients, statistics over valid frames only", "[layers][gradcheck]") {
  LayerHarness h;
  SequenceBatchNorm bn(h.ctx, "bn", {3});
  randomize(h, 11);
  bn.set_lengths({4, 2});
  check_layer_gradients(bn, h, {4, 2, 3}, random_vector(4 * 2 * 3, 12));

  // Normalized over the 6 valid frames: each channel's valid outputs have mean beta; padding is 0.
  LayerHarness h2;
  SequenceBatchNorm plain(h2.ctx, "bn", {3});
  h2.params.allocate(h2.ctx.backend);
  h2.buffers.allocate(h2.ctx.backend);
  Rng rng(0);
  plain.init(rng);
  h2.params.upload_initial_values();
  h2.buffers.upload_initial_values();
  std::vector<float> x = random_vector(4 * 2 * 3, 13);
  for (int t = 2; t < 4; ++t)
    for (int c = 0; c < 3; ++c) x[(t * 2 + 1) * 3 + c] = 1000.f;  // padding of sequence 1
  plain.set_lengths({4, 2});
  const Tensor& y = plain.forward(Tensor{x.data(), {4, 2, 3}}, Mode::kTrain);
  for (int c = 0; c < 3; ++c) {
    double mean = 0;
    for (int t = 0; t < 4; ++t)
      for (int n = 0; n < 2; ++n)
        if (n == 0 || t < 2) mean += y.data[(t * 2 + n) * 3 + c];
    CHECK(mean / 6 == Approx(0).margin(1e-5));
    CHECK(y.data[(3 * 2 + 1) * 3 + c] == 0.f);
  }
  CHECK(h2.params.find("bn.weight") >= 0);
  CHECK(h2.buffers.find("bn.running_var") >= 0);
}

TEST_CASE("Lookahead convolution gradients and definition", "[layers][gradcheck]") {
  LayerHarness h;
  Lookahead lookahead(h.ctx, "lookahead", 3, 2);
  randomize(h, 14);
  check_layer_gradients(lookahead, h, {5, 2, 3}, random_vector(5 * 2 * 3, 15));

  // y[t, n, c] = sum_k w[c, k] x[t + k, n, c], zero past the end.
  std::vector<float> x = random_vector(5 * 2 * 3, 16);
  const Tensor& y = lookahead.forward(Tensor{x.data(), {5, 2, 3}}, Mode::kEval);
  const float* w = h.params.value(0).data;
  for (int t = 0; t < 5; ++t)
    for (int n = 0; n < 2; ++n)
      for (int c = 0; c < 3; ++c) {
        double expected = 0;
        for (int k = 0; k <= 2 && t + k < 5; ++k) expected += w[c * 3 + k] * x[((t + k) * 2 + n) * 3 + c];
        CHECK(y.data[(t * 2 + n) * 3 + c] == Approx(expected).margin(1e-6));
      }
}

TEST_CASE("Hardtanh(0, 20) gradients", "[layers][gradcheck]") {
  LayerHarness h;
  Hardtanh clip(h.ctx, 0.f, 20.f);
  randomize(h, 17);
  std::vector<float> x = random_vector(60, 18, 12.f, 0.05f);  // spans both kinks
  GradCheckOptions opt;
  opt.h = 1e-3;
  check_layer_gradients(clip, h, {3, 4, 5}, x, opt);
}
