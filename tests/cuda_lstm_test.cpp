// The cuDNN LSTM (models/cuda/cudnn_lstm.cpp) against the CPU's (models/cpu/lstm_stack.cpp on
// oneDNN's direction ops), op against op and through the Lstm layer: unidirectional and
// bidirectional, one and two layers, lengths of 1 and of T, unsorted, T = 1, a second batch with
// other lengths on the same op (the descriptors and the device lengths follow), an inference
// forward, finite junk in the padding rows of x and dy (which must not matter), and every output
// poisoned with NaN before the GPU writes it. FP32 on both sides (FMA math, no TF32).
//
// Tolerance, element-wise as tests/cuda_parity.h's require_close (|cpu - cuda| <= rel * max(|cpu|,
// the tensor's RMS)): 1e-5 for the short sequences. The 48-step case allows 1e-4: its errors pass
// through 48 steps of recurrence (each step's rounding, from GEMMs summed in another order and
// cuDNN's own sigmoid and tanh, feeds every later step), and its weight gradients are sums of
// 6 x 48 products per direction whose order differs. For scale, the CPU's own two LSTMs (oneDNN
// and OpenBLAS GEMMs) differ on these cases by at most 2.2e-6 (short) and 4.5e-6 (48 steps).
//
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/device_buffer.h"
#include "models/layers/lstm.h"
#include "cuda_parity.h"

using namespace trainer::models;
using namespace trainer::cuda_testing;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The padding rows (t >= lengths[n]) of a {T, N, cols} tensor must be exactly zero.
void require_zero_padding(const std::vector<float>& v, int64_t T, int64_t N, int64_t cols,
                          const std::vector<int32_t>& lengths, const std::string& what) {
  int64_t bad = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      if (t >= lengths[n])
        for (int64_t c = 0; c < cols; ++c) bad += v[(t * N + n) * cols + c] != 0.f;
  INFO(what << ": padding values that are not zero: " << bad);
  CHECK(bad == 0);
}

// Finite junk in the padding rows of a {T, N, cols} tensor.
void junk_padding(std::vector<float>& v, int64_t T, int64_t N, int64_t cols, const std::vector<int32_t>& lengths) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      if (t >= lengths[n])
        for (int64_t c = 0; c < cols; ++c) v[(t * N + n) * cols + c] = 5.f + 0.25f * static_cast<float>(c % 7);
}

// Every (layer, direction)'s four tensors as host vectors, PyTorch's layout and initialization range.
struct HostParams {
  std::vector<std::vector<float>> tensors[4];  // w_ih, w_hh, b_ih, b_hh; each indexed layer * D + d
  HostParams(const LstmGeometry& g, uint64_t seed) {
    const float bound = 1.f / std::sqrt(static_cast<float>(g.hidden));
    const int64_t H = g.hidden, D = g.directions();
    for (int64_t i = 0; i < g.layers * D; ++i) {
      const int64_t rows[4] = {4 * H * g.layer_input(i / D), 4 * H * H, 4 * H, 4 * H};
      for (int k = 0; k < 4; ++k) tensors[k].push_back(random_vector(rows[k], seed++, -bound, bound));
    }
  }
};

const char* kTensorNames[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};

// An LSTM and the padded length of the batches it runs on.
struct LstmShape {
  int64_t steps = 0, batch = 0, input = 0, hidden = 0, layers = 1;
  bool bidirectional = false;
  LstmGeometry geometry() const { return {input, hidden, layers, bidirectional}; }
};

// One op on each backend, run over each lengths set in turn (N = its size; T = steps_per_pass[pass],
// or the shape's steps), compared after every pass: the ops serve every batch shape.
void check_lstm(const LstmShape& shape, const std::vector<std::vector<int32_t>>& batches, uint64_t seed, double rel,
                const std::vector<int64_t>& steps_per_pass = {}) {
  const LstmGeometry g = shape.geometry();
  const int64_t I = g.input, H = g.hidden, D = g.directions();
  INFO("LSTM T " << shape.steps << ", N " << shape.batch << ", input " << I << ", hidden " << H << ", layers "
                 << g.layers << (g.bidirectional ? ", bidirectional" : ", unidirectional"));
  HostParams p(g, seed);
  const int64_t pairs = g.layers * D;
  // CPU weights and gradient buffers.
  LstmWeights cw;
  LstmGradients cg;
  std::vector<std::vector<float>> cgrad[4];
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < pairs; ++i) cgrad[k].emplace_back(p.tensors[k][i].size(), kNaN);
  for (int64_t i = 0; i < pairs; ++i) {
    cw.w_ih.push_back(p.tensors[0][i].data()), cw.w_hh.push_back(p.tensors[1][i].data());
    cw.b_ih.push_back(p.tensors[2][i].data()), cw.b_hh.push_back(p.tensors[3][i].data());
    cg.w_ih.push_back(cgrad[0][i].data()), cg.w_hh.push_back(cgrad[1][i].data());
    cg.b_ih.push_back(cgrad[2][i].data()), cg.b_hh.push_back(cgrad[3][i].data());
  }
  // The same on the GPU.
  std::vector<GpuArray> gparam[4], ggrad[4];
  LstmWeights gw;
  LstmGradients gg;
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < pairs; ++i) {
      gparam[k].emplace_back(p.tensors[k][i]);
      ggrad[k].emplace_back(static_cast<int64_t>(p.tensors[k][i].size()));
    }
  for (int64_t i = 0; i < pairs; ++i) {
    gw.w_ih.push_back(gparam[0][i].data()), gw.w_hh.push_back(gparam[1][i].data());
    gw.b_ih.push_back(gparam[2][i].data()), gw.b_hh.push_back(gparam[3][i].data());
    gg.w_ih.push_back(ggrad[0][i].data()), gg.w_hh.push_back(ggrad[1][i].data());
    gg.b_ih.push_back(ggrad[2][i].data()), gg.b_hh.push_back(ggrad[3][i].data());
  }
  auto c = cpu().make_lstm(g);
  auto d = gpu().make_lstm(g);

  for (size_t pass = 0; pass < batches.size(); ++pass) {
    const std::vector<int32_t>& lengths = batches[pass];
    const int64_t T = steps_per_pass.empty() ? shape.steps : steps_per_pass[pass];
    const int64_t N = static_cast<int64_t>(lengths.size());
    std::string list;
    for (int32_t l : lengths) list += " " + std::to_string(l);
    INFO("pass " << pass << ", T " << T << ", lengths" << list);
    auto x = random_vector(T * N * I, seed + 100 + pass), dy = random_vector(T * N * D * H, seed + 200 + pass);
    junk_padding(x, T, N, I, lengths);
    junk_padding(dy, T, N, D * H, lengths);
    std::vector<float> y(T * N * D * H, kNaN), yi(T * N * D * H, kNaN), dx(T * N * I, kNaN);
    c->forward(T, N, x.data(), lengths.data(), cw, yi.data(), false);
    c->forward(T, N, x.data(), lengths.data(), cw, y.data(), true);
    c->backward(T, N, x.data(), lengths.data(), cw, y.data(), dy.data(), dx.data(), cg);

    GpuArray gx(x), gdy(dy), gy(T * N * D * H), gyi(T * N * D * H), gdx(T * N * I);
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < pairs; ++i) gpu().fill(ggrad[k][i].n, kNaN, ggrad[k][i].data());
    d->forward(T, N, gx.data(), lengths.data(), gw, gyi.data(), false);
    d->forward(T, N, gx.data(), lengths.data(), gw, gy.data(), true);
    d->backward(T, N, gx.data(), lengths.data(), gw, gy.data(), gdy.data(), gdx.data(), gg);

    const auto hy = gy.host(), hyi = gyi.host(), hdx = gdx.host();
    const double ey = std::max(require_close(yi, hyi, "inference forward y", rel),
                               require_close(y, hy, "training forward y", rel));
    const double edx = require_close(dx, hdx, "dx", rel);
    require_zero_padding(hy, T, N, D * H, lengths, "y");
    require_zero_padding(hyi, T, N, D * H, lengths, "inference y");
    require_zero_padding(hdx, T, N, I, lengths, "dx");
    double egrad = 0;
    for (int64_t i = 0; i < pairs; ++i)
      for (int k = 0; k < 4; ++k)
        egrad = std::max(egrad, require_close(cgrad[k][i], ggrad[k][i].host(),
                                              std::string("gradient of ") + kTensorNames[k] + " of layer " +
                                                  std::to_string(i / D) + (i % D ? " reverse" : ""),
                                              rel));
    // Printed on success too: what the tolerances leave as margin on this GPU.
    WARN("T " << T << " L " << g.layers << " D " << D << " pass " << pass << ": largest relative error y "
              << ey << ", dx " << edx << ", weight gradients " << egrad << " (tolerance " << rel << ")");
    for (int64_t i = 0; i < pairs; ++i) {
      const auto bih = ggrad[2][i].host(), bhh = ggrad[3][i].host();
      CHECK(std::memcmp(bih.data(), bhh.data(), sizeof(float) * bih.size()) == 0);
    }
  }
}

}  // namespace

TEST_CASE("cuDNN LSTM matches the CPU: one layer, both directions, lengths 1 and T, unsorted", "[cuda][lstm]") {
  for (bool bidirectional : {false, true})
    check_lstm({6, 4, 5, 7, 1, bidirectional}, {{6, 1, 4, 3}, {2, 6, 6, 5}, {6, 6, 6, 6}}, 10, 1e-5);
}

TEST_CASE("cuDNN LSTM matches the CPU: two layers, both directions", "[cuda][lstm]") {
  for (bool bidirectional : {false, true})
    check_lstm({9, 5, 6, 8, 2, bidirectional}, {{9, 1, 5, 9, 2}, {3, 7, 9, 1, 4}}, 20, 1e-5);
}

TEST_CASE("cuDNN LSTM matches the CPU: T = 1", "[cuda][lstm]") {
  check_lstm({1, 3, 4, 5, 2, true}, {{1, 1, 1}}, 30, 1e-5);
  check_lstm({1, 2, 3, 4, 1, false}, {{1, 1}}, 40, 1e-5);
}

TEST_CASE("cuDNN LSTM matches the CPU on a 48-step batch (two bidirectional layers)", "[cuda][lstm]") {
  check_lstm({48, 6, 32, 64, 2, true}, {{48, 17, 1, 33, 48, 40}}, 50, 1e-4);
}

TEST_CASE("One cuDNN LSTM op serves batches of changing length and size, as speech batches come", "[cuda][lstm]") {
  // T and N change from pass to pass on the same ops: descriptors, device lengths, workspace and
  // reserve follow (growing, then shrinking back to a smaller batch).
  check_lstm({12, 3, 5, 6, 2, true}, {{12, 4, 9}, {20, 20, 7, 1, 13}, {2, 1}, {12, 4, 9}}, 70, 1e-5, {12, 20, 2, 12});
}

TEST_CASE("cuDNN LSTM refuses empty sequences and backward without a training forward", "[cuda][lstm]") {
  const LstmGeometry g{3, 5, 1, false};
  HostParams p(g, 60);
  GpuArray w_ih(p.tensors[0][0]), w_hh(p.tensors[1][0]), b_ih(p.tensors[2][0]), b_hh(p.tensors[3][0]);
  GpuArray x(random_vector(4 * 2 * 3, 61)), y(4 * 2 * 5), dy(random_vector(4 * 2 * 5, 62)), dx(4 * 2 * 3);
  GpuArray dw_ih(int64_t(60)), dw_hh(int64_t(100)), db_ih(int64_t(20)), db_hh(int64_t(20));
  const LstmWeights w{{w_ih.data()}, {w_hh.data()}, {b_ih.data()}, {b_hh.data()}};
  const LstmGradients grads{{dw_ih.data()}, {dw_hh.data()}, {db_ih.data()}, {db_hh.data()}};
  auto op = gpu().make_lstm(g);
  const std::vector<int32_t> empty{4, 0}, fine{4, 2};
  CHECK_THROWS_WITH(op->forward(4, 2, x.data(), empty.data(), w, y.data(), true), Catch::Contains("empty sequences"));
  op->forward(4, 2, x.data(), fine.data(), w, y.data(), false);
  CHECK_THROWS_WITH(op->backward(4, 2, x.data(), fine.data(), w, y.data(), dy.data(), dx.data(), grads),
                    Catch::Contains("training forward"));
}

TEST_CASE("The Lstm layer on CUDA matches the CPU (two bidirectional layers, PyTorch's parameters)",
          "[cuda][lstm]") {
  const int64_t T = 7, N = 3, I = 5, H = 6;
  const std::vector<int32_t> lengths{5, 7, 2};
  auto run = [&](Backend& backend, std::vector<float>& y, std::vector<float>& dx, std::vector<float>& grads) {
    ParameterStore params{true}, buffers{false};
    LayerContext ctx{backend, params, buffers};
    Lstm lstm(ctx, "rnn", {I, H, 2, true});
    params.allocate(backend);
    buffers.allocate(backend);
    auto values = random_vector(params.size(), 70, -0.4f, 0.4f);
    params.copy_values_from_host(values.data(), sizeof(float) * values.size());
    auto x = random_vector(T * N * I, 71), dy = random_vector(T * N * 2 * H, 72);
    DeviceBuffer bx(backend, x.size()), bdy(backend, dy.size());
    copy_to_device(backend, x.data(), x.size(), bx.data());
    copy_to_device(backend, dy.data(), dy.size(), bdy.data());
    lstm.set_lengths(lengths);
    const Tensor& out = lstm.forward(Tensor{bx.data(), {T, N, I}}, Mode::kTrain);
    y.resize(out.numel());
    copy_to_host(backend, out.data, out.numel(), y.data());
    const Tensor& g = lstm.backward(Tensor{bdy.data(), out.shape});
    dx.resize(g.numel());
    copy_to_host(backend, g.data, g.numel(), dx.data());
    grads.resize(params.size());
    copy_to_host(backend, params.grads(), params.size(), grads.data());
  };
  std::vector<float> y, dx, grads, gy, gdx, ggrads;
  run(cpu(), y, dx, grads);
  run(gpu(), gy, gdx, ggrads);
  require_close(y, gy, "layer y", 1e-5);
  require_close(dx, gdx, "layer dx", 1e-5);
  require_close(grads, ggrads, "layer parameter gradients", 1e-5);
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }
#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
