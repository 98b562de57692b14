// Forward and backward parity with PyTorch on two small networks (fixtures made by
// scripts/make_torch_fixtures.py with Debian's torch; the test itself needs no torch).
// Tolerance: the largest difference of each tensor within 1e-4 of that tensor's largest magnitude,
// against PyTorch's float64 result where the fixture has one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/model.h"
#include "models/nets/basic_block.h"
#include "models/safetensors.h"

using namespace trainer::models;

namespace {

// The fixture's float64 value of `name` when present, else its float32 value.
std::vector<double> reference(const SafeTensorsFile& f, const std::string& name) {
  return f.contains("f64." + name) ? f.at("f64." + name).as_f64() : f.at(name).as_f64();
}

void check_close(const std::string& what, const float* actual, const std::vector<double>& expected) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(expected[i]));
    max_diff = std::max(max_diff, std::fabs(actual[i] - expected[i]));
  }
  INFO(what << ": max |difference| " << max_diff << ", max |reference| " << max_ref);
  // A reference that is zero up to rounding (a conv bias feeding batch norm) is compared absolutely.
  CHECK(max_diff <= (max_ref < 1e-5 ? 1e-5 : 1e-4 * max_ref));
}

// NCHW (PyTorch) <-> the engine's layouts.
std::vector<float> to_nhwc(const std::vector<float>& x, const Shape& nchw) {
  std::vector<float> y(x.size());
  Tensor t{y.data(), nchw, Layout::kChannelsLast};
  cpu_backend().from_nchw(x.data(), t);
  return y;
}
std::vector<float> to_nchw(const float* x, const Shape& nchw, Layout layout) {
  std::vector<float> y(numel(nchw));
  cpu_backend().to_nchw(Tensor{const_cast<float*>(x), nchw, layout}, y.data());
  return y;
}

void load_parameters(ImageClassifier& m, const SafeTensorsFile& f) {
  for (const auto& v : m.parameters().views()) {
    auto values = f.at("param." + v.name).as_f32();
    REQUIRE(static_cast<int64_t>(values.size()) == v.numel());
    std::copy(values.begin(), values.end(), m.parameters().values() + v.offset);
  }
}

struct Result {
  double loss;
  std::vector<float> grad_input;  // NCHW
};

Result train_step(ImageClassifier& m, const SafeTensorsFile& f, const std::vector<int32_t>& labels) {
  const Shape shape = f.at("input").shape;
  std::vector<float> x = to_nhwc(f.at("input").as_f32(), shape);
  Result r;
  r.loss = m.forward(Tensor{x.data(), shape}, labels.data(), Mode::kTrain);
  m.backward();
  return r;
}

std::vector<int32_t> labels_of(const SafeTensorsFile& f) {
  auto t = f.at("target").as_i64();
  return std::vector<int32_t>(t.begin(), t.end());
}

// A pass-through layer that records what flows through it: the activation forward and its
// gradient backward (so the test can read a model's input gradient and intermediate outputs).
class Tap final : public Layer {
 public:
  const Tensor& forward(const Tensor& x, Mode) override {
    value.assign(x.data, x.data + x.numel());
    layout = x.layout;
    return x;
  }
  const Tensor& backward(const Tensor& dy) override {
    grad.assign(dy.data, dy.data + dy.numel());
    return dy;
  }
  std::vector<float> value, grad;
  Layout layout = Layout::kChannelsLast;
};

Tap* add_tap(ImageClassifier& m) {
  auto tap = std::make_unique<Tap>();
  Tap* raw = tap.get();
  m.add(std::move(tap));
  return raw;
}

}  // namespace

TEST_CASE("Conv+BN+ReLU+MaxPool+Linear matches PyTorch forward and backward", "[parity]") {
  const auto f = read_safetensors(std::string(TRAINER_FIXTURES) + "/small_cnn.safetensors");
  for (float smoothing : {0.f, 0.1f}) {
    SECTION(smoothing == 0.f ? "plain cross-entropy" : "label smoothing 0.1") {
      ImageClassifier m(cpu_backend(), "small_cnn", smoothing);
      LayerContext ctx = m.context();
      Tap* input_grad = add_tap(m);
      m.add(std::make_unique<Conv2d>(ctx, "0", Conv2dOptions{3, 8, 3, 3, 1, 1, 1, 1, true}));
      m.add(std::make_unique<BatchNorm2d>(ctx, "1", BatchNormOptions{8, 1e-5f, 0.1f, /*relu=*/true}));
      m.add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kMax, 2, 2, 0, false}));
      m.add(std::make_unique<Flatten>(ctx));
      m.add(std::make_unique<Linear>(ctx, "5", 128, 10));
      m.finish(0);
      load_parameters(m, f);

      const std::string g = smoothing == 0.f ? "grad." : "grad_ls.";
      const Result r = train_step(m, f, labels_of(f));
      CHECK(r.loss == Approx(reference(f, smoothing == 0.f ? "loss" : "loss_ls")[0]).epsilon(1e-5));
      if (smoothing == 0.f) check_close("output", m.logits().data, reference(f, "output"));
      check_close(g + "input", to_nchw(input_grad->grad.data(), f.at("input").shape, input_grad->layout).data(), reference(f, g + "input"));
      for (const auto& v : m.parameters().views())
        check_close(g + "param." + v.name, m.parameters().grads() + v.offset, reference(f, g + "param." + v.name));
      for (const auto& v : m.buffers().views())
        check_close("buffer." + v.name, m.buffers().values() + v.offset, reference(f, "buffer." + v.name));
      if (smoothing == 0.f) {
        std::vector<float> x = to_nhwc(f.at("input").as_f32(), f.at("input").shape);
        m.forward(Tensor{x.data(), f.at("input").shape}, labels_of(f).data(), Mode::kEval);
        check_close("output_eval", m.logits().data, reference(f, "output_eval"));
      }
    }
  }
}

TEST_CASE("ResNet basic blocks (option-A and identity shortcuts) match PyTorch", "[parity]") {
  const auto f = read_safetensors(std::string(TRAINER_FIXTURES) + "/resnet_block.safetensors");
  const auto fg = read_safetensors(std::string(TRAINER_FIXTURES) + "/resnet_block_grads.safetensors");
  ImageClassifier m(cpu_backend(), "blocks", 0.f);
  LayerContext ctx = m.context();
  Tap* input_grad = add_tap(m);
  m.add(std::make_unique<BasicBlock>(ctx, "A", 16, 32, 2, Shortcut::kOptionA));
  Tap* out_a = add_tap(m);
  m.add(std::make_unique<BasicBlock>(ctx, "B", 32, 32, 1, Shortcut::kIdentity));
  Tap* out_b = add_tap(m);
  m.add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kAverage, 1, 1, 0, true}));
  m.add(std::make_unique<Flatten>(ctx));
  m.add(std::make_unique<Linear>(ctx, "fc", 32, 10));
  m.finish(0);
  load_parameters(m, f);

  const Result r = train_step(m, f, labels_of(f));
  CHECK(r.loss == Approx(reference(f, "loss")[0]).epsilon(1e-5));
  check_close("output", m.logits().data, reference(f, "output"));
  const Shape block_shape{2, 32, 4, 4};
  check_close("output.A", to_nchw(out_a->value.data(), block_shape, out_a->layout).data(), reference(f, "output.A"));
  check_close("output.B", to_nchw(out_b->value.data(), block_shape, out_b->layout).data(), reference(f, "output.B"));
  check_close("grad.input", to_nchw(input_grad->grad.data(), f.at("input").shape, input_grad->layout).data(), reference(fg, "grad.input"));
  for (const auto& v : m.parameters().views())
    check_close("grad.param." + v.name, m.parameters().grads() + v.offset, reference(fg, "grad.param." + v.name));
  for (const auto& v : m.buffers().views())
    check_close("buffer." + v.name, m.buffers().values() + v.offset, reference(f, "buffer." + v.name));
}
