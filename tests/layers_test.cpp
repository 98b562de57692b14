// Gradient checks of every layer against central finite differences (see gradcheck.h).
#include "gradcheck.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/layers/relu.h"
#include "models/layers/shortcut_a.h"
#include "models/nets/basic_block.h"

using namespace trainer::models;
using namespace trainer::testing;

namespace {

// Allocates the harness stores and gives every parameter a random value (not the init: BN gammas
// of exactly 1 and zero biases would hide mistakes).
void randomize(LayerHarness& h, uint64_t seed) {
  h.params.allocate(h.ctx.backend);
  h.buffers.allocate(h.ctx.backend);
  auto v = random_vector(h.params.size(), seed, 0.5f);
  std::copy(v.begin(), v.end(), h.params.values());
}

}  // namespace

TEST_CASE("Conv2d gradients", "[layers][gradcheck]") {
  struct Case { Conv2dOptions opt; int64_t h, w; };
  const Case cases[] = {
      {{3, 4, 3, 3, 1, 1, 1, 1, true}, 5, 5},   // 3x3 same padding, bias
      {{2, 3, 3, 3, 2, 2, 1, 1, false}, 6, 5},  // stride 2, odd width
      {{3, 2, 1, 1, 2, 2, 0, 0, false}, 4, 4},  // 1x1 projection
      {{1, 2, 5, 3, 2, 1, 2, 1, true}, 7, 6},   // asymmetric kernel, stride and padding
      {{3, 16, 3, 3, 1, 1, 1, 1, false}, 4, 4}, // channels-last in, 16-blocked out (the stem)
  };
  int index = 0;
  for (const auto& c : cases) {
    SECTION("case " + std::to_string(index++)) {
      LayerHarness h;
      Conv2d conv(h.ctx, "conv", c.opt);
      randomize(h, 1);
      const int64_t n = 2;
      check_layer_gradients(conv, h, {n, c.opt.in_channels, c.h, c.w},
                            random_vector(n * c.opt.in_channels * c.h * c.w, 2));
    }
  }
}

TEST_CASE("Conv2d gradients in blocked layouts: direct and Winograd", "[layers][gradcheck]") {
  // 32 -> 32 channels, 3x3 stride 1: the default algorithm choice takes Winograd here where oneDNN
  // has it (AVX-512); 16 -> 32 stride 2 stays direct. Inputs in both blocked layouts, whichever
  // this machine's kernels prefer (the other one may run oneDNN's reference kernels: still exact).
  struct Case { Conv2dOptions opt; int64_t h, w; };
  const Case cases[] = {{{32, 32, 3, 3, 1, 1, 1, 1, false}, 6, 6}, {{16, 32, 3, 3, 2, 2, 1, 1, true}, 6, 6}};
  int index = 0;
  for (const auto& c : cases)
  for (Layout layout : {Layout::kBlocked8, Layout::kBlocked16}) {
    SECTION("case " + std::to_string(index++) + " " + layout_name(layout)) {
      LayerHarness h;
      Conv2d conv(h.ctx, "conv", c.opt);
      randomize(h, 21);
      GradCheckOptions opt;
      opt.max_checks_per_tensor = 48;
      const int64_t n = 2;
      check_layer_gradients(conv, h, {n, c.opt.in_channels, c.h, c.w},
                            random_vector(n * c.opt.in_channels * c.h * c.w, 22, 0.5f), opt, layout);
    }
  }
}

TEST_CASE("BatchNorm2d gradients, plain and with fused ReLU", "[layers][gradcheck]") {
  for (bool relu : {false, true}) {
    SECTION(relu ? "fused relu" : "plain") {
      LayerHarness h;
      BatchNorm2d bn(h.ctx, "bn", {3, 1e-5f, 0.1f, relu});
      randomize(h, 3);
      GradCheckOptions opt;
      opt.h = 1e-3;  // small enough that no normalized value crosses the ReLU kink
      check_layer_gradients(bn, h, {4, 3, 3, 2}, random_vector(4 * 3 * 3 * 2, 4), opt);
    }
  }
  for (bool relu : {false, true})
  for (Layout layout : {Layout::kBlocked8, Layout::kBlocked16}) {
    SECTION(std::string(layout_name(layout)) + (relu ? ", fused relu" : "")) {
      LayerHarness h;
      BatchNorm2d bn(h.ctx, "bn", {16, 1e-5f, 0.1f, relu});
      randomize(h, 23);
      GradCheckOptions opt;
      opt.h = 3e-4;  // 1e-3 lets one normalized value of channel 10 cross the ReLU kink
      // The same logical input in each layout (the same floats stored as they are would land on
      // other channels, and next to another kink).
      const std::vector<float> nchw = random_vector(2 * 16 * 3 * 2, 24);
      std::vector<float> x(nchw.size());
      Tensor xt{x.data(), {2, 16, 3, 2}, layout};
      h.ctx.backend.from_nchw(nchw.data(), xt);
      check_layer_gradients(bn, h, xt.shape, x, opt, layout);
    }
  }
}

TEST_CASE("BatchNorm2d gradients with frozen statistics", "[layers][gradcheck]") {
  for (Layout layout : {Layout::kChannelsLast, Layout::kBlocked8, Layout::kBlocked16}) {
    SECTION(layout_name(layout)) {
      LayerHarness h;
      BatchNorm2d bn(h.ctx, "bn", {16, 1e-5f, 0.1f, false, /*frozen=*/true});
      randomize(h, 27);
      auto stats = random_vector(h.buffers.size(), 28, 0.3f);
      for (int64_t c = 0; c < 16; ++c) {  // running_mean, then running_var (kept positive)
        h.buffers.values()[c] = stats[c];
        h.buffers.values()[16 + c] = 0.5f + std::fabs(stats[16 + c]);
      }
      std::vector<float> before(h.buffers.values(), h.buffers.values() + h.buffers.size());
      check_layer_gradients(bn, h, {2, 16, 3, 2}, random_vector(2 * 16 * 3 * 2, 29), {}, layout);
      CHECK(std::equal(before.begin(), before.end(), h.buffers.values()));  // running stats untouched
    }
  }
}

TEST_CASE("BatchNorm2d running statistics follow PyTorch (unbiased variance, momentum 0.1)", "[layers]") {
  LayerHarness h;
  BatchNorm2d bn(h.ctx, "bn", {2});
  h.params.allocate(h.ctx.backend);
  h.buffers.allocate(h.ctx.backend);
  Rng rng(0);
  bn.init(rng);
  h.params.upload_initial_values();
  h.buffers.upload_initial_values();
  std::vector<float> x = random_vector(3 * 2 * 2 * 2, 5);  // N=3, C=2, H=W=2, channels-last
  bn.forward(Tensor{x.data(), {3, 2, 2, 2}}, Mode::kTrain);
  for (int c = 0; c < 2; ++c) {
    double mean = 0, sq = 0;
    for (int i = 0; i < 12; ++i) mean += x[i * 2 + c];
    mean /= 12;
    for (int i = 0; i < 12; ++i) sq += (x[i * 2 + c] - mean) * (x[i * 2 + c] - mean);
    CHECK(h.buffers.value(0).data[c] == Approx(0.1 * mean).margin(1e-6));
    CHECK(h.buffers.value(1).data[c] == Approx(0.9 + 0.1 * sq / 11).margin(1e-6));
  }
}

TEST_CASE("Linear gradients", "[layers][gradcheck]") {
  LayerHarness h;
  Linear fc(h.ctx, "fc", 7, 5);
  randomize(h, 6);
  check_layer_gradients(fc, h, {3, 7}, random_vector(21, 7));
}

TEST_CASE("ReLU gradients", "[layers][gradcheck]") {
  LayerHarness h;
  ReLU relu(h.ctx);
  randomize(h, 8);
  check_layer_gradients(relu, h, {2, 3, 4, 4}, random_vector(96, 9, 1.f, 0.05f));
}

TEST_CASE("Pooling gradients", "[layers][gradcheck]") {
  struct Case { const char* name; Pool2dOptions opt; };
  const Case cases[] = {{"max 2x2", {PoolKind::kMax, 2, 2, 0, false}},
                        {"max 3x3 stride 2 pad 1", {PoolKind::kMax, 3, 2, 1, false}},
                        {"avg 2x2", {PoolKind::kAverage, 2, 2, 0, false}},
                        {"avg 3x3 pad 1 (excludes padding)", {PoolKind::kAverage, 3, 2, 1, false}},
                        {"global avg", {PoolKind::kAverage, 1, 1, 0, true}}};
  for (const auto& c : cases) {
    SECTION(c.name) {
      LayerHarness h;
      Pool2d pool(h.ctx, c.opt);
      randomize(h, 10);
      GradCheckOptions opt;
      opt.h = 1e-3;  // below the gap between the values competing for a max
      check_layer_gradients(pool, h, {2, 3, 6, 5}, random_vector(180, 11), opt);
    }
  }
}

TEST_CASE("Flatten gradients and PyTorch order", "[layers][gradcheck]") {
  LayerHarness h;
  Flatten flatten(h.ctx);
  randomize(h, 12);
  check_layer_gradients(flatten, h, {2, 3, 2, 2}, random_vector(24, 13));
  // Channels-last element (n, h, w, c) lands at PyTorch's flat position c*H*W + h*W + w.
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[i] = static_cast<float>(i);
  const Tensor& y = flatten.forward(Tensor{x.data(), {2, 3, 2, 2}}, Mode::kEval);
  CHECK(y.data[1 * 4 + 0 * 2 + 1] == x[(0 * 2 + 1) * 3 + 1]);  // n=0, c=1, h=0, w=1
}

TEST_CASE("Option-A shortcut gradients", "[layers][gradcheck]") {
  LayerHarness h;
  ShortcutA shortcut(h.ctx, 2, 2);
  randomize(h, 14);
  check_layer_gradients(shortcut, h, {2, 3, 5, 4}, random_vector(120, 15));
  // The output takes the backend's layout for 32 channels, so on AVX-512 an 8-blocked input also
  // checks the loops across two layouts.
  for (Layout layout : {Layout::kBlocked8, Layout::kBlocked16}) {
    SECTION(std::string(layout_name(layout)) + ", 16 -> 32 channels") {
      LayerHarness hb;
      ShortcutA blocked(hb.ctx, 2, 8);
      randomize(hb, 25);
      check_layer_gradients(blocked, hb, {2, 16, 5, 4}, random_vector(640, 26), {}, layout);
    }
  }
}

TEST_CASE("Residual basic block gradients, all shortcut kinds", "[layers][gradcheck]") {
  struct Case { const char* name; int64_t in, planes, stride; Shortcut sc; };
  const Case cases[] = {{"identity", 4, 4, 1, Shortcut::kIdentity},
                        {"option A", 4, 8, 2, Shortcut::kOptionA},
                        {"projection", 4, 6, 2, Shortcut::kProjection}};
  // The 16-blocked block (with Winograd inside) is checked against PyTorch's float64 result in
  // torch_parity_test: two batch norms over 12 values per channel and two ReLUs make float32
  // finite differences of the whole block too noisy at those widths.
  for (const auto& c : cases) {
    SECTION(c.name) {
      LayerHarness h;
      BasicBlock block(h.ctx, "block", c.in, c.planes, c.stride, c.sc);
      randomize(h, 16);
      GradCheckOptions opt;
      opt.h = 1e-3;
      opt.atol = 2e-3;
      opt.max_checks_per_tensor = 24;
      check_layer_gradients(block, h, {3, c.in, 4, 4}, random_vector(3 * c.in * 16, 17), opt,
                            h.ctx.backend.activation_layout(c.in));
    }
  }
}

TEST_CASE("Residual basic block: an input in another layout than the convolutions choose", "[layers]") {
  // The convolutions write the layout this CPU prefers, so an identity branch in the other blocked
  // layout is reordered for the add and its gradient back (BasicBlock::in_layout). Same logical
  // input, same parameters: outputs and gradients equal those of an input in the preferred layout
  // up to the rounding of the convolution kernels each layout gets.
  Backend& be = cpu_backend();
  const Layout preferred = be.activation_layout(16);
  const Layout other = preferred == Layout::kBlocked16 ? Layout::kBlocked8 : Layout::kBlocked16;
  const Shape shape{3, 16, 4, 4};
  const std::vector<float> x_nchw = random_vector(numel(shape), 30), dy_nchw = random_vector(numel(shape), 31);
  struct Result { std::vector<float> y, dx, dparams; };
  auto run = [&](Layout layout) {
    LayerHarness h;
    BasicBlock block(h.ctx, "block", 16, 16, 1, Shortcut::kIdentity);
    randomize(h, 32);
    std::vector<float> x_data(x_nchw.size()), dy_data(dy_nchw.size());
    Tensor x{x_data.data(), shape, layout};
    be.from_nchw(x_nchw.data(), x);
    const Tensor& y = block.forward(x, Mode::kTrain);
    Result r{std::vector<float>(y.numel()), std::vector<float>(x.numel()), {}};
    be.to_nchw(y, r.y.data());
    Tensor dy{dy_data.data(), shape, y.layout};
    be.from_nchw(dy_nchw.data(), dy);
    const Tensor& dx = block.backward(dy);
    CHECK(dx.layout == layout);
    be.to_nchw(dx, r.dx.data());
    r.dparams.assign(h.params.grads(), h.params.grads() + h.params.size());
    return r;
  };
  const Result a = run(preferred), b = run(other);
  auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
    REQUIRE(u.size() == v.size());
    for (size_t i = 0; i < u.size(); ++i) REQUIRE(u[i] == Approx(v[i]).epsilon(1e-4).margin(1e-5));
  };
  same(a.y, b.y);
  same(a.dx, b.dx);
  same(a.dparams, b.dparams);
}

TEST_CASE("Softmax cross-entropy: value and gradient", "[layers][gradcheck]") {
  const int64_t n = 3, k = 5;
  std::vector<float> z = random_vector(n * k, 18, 2.f);
  std::vector<int32_t> labels{4, 0, 2};
  for (float smoothing : {0.f, 0.1f}) {
    std::vector<float> dz(n * k);
    Backend& be = cpu_backend();
    be.softmax_cross_entropy(n, k, z.data(), labels.data(), smoothing, dz.data(), nullptr);
    for (int64_t i = 0; i < n * k; ++i) {
      const float saved = z[i];
      const double h = 1e-2;
      z[i] = saved + h;
      const double plus = be.softmax_cross_entropy(n, k, z.data(), labels.data(), smoothing, nullptr, nullptr);
      z[i] = saved - h;
      const double minus = be.softmax_cross_entropy(n, k, z.data(), labels.data(), smoothing, nullptr, nullptr);
      z[i] = saved;
      CHECK(dz[i] == Approx((plus - minus) / (2 * h)).margin(1e-4));
    }
  }
}
