// Finite-difference gradient checks for layers.
//
// The layers compute in float32 (as the engine does); the check perturbs one input or parameter
// element at a time by +-h, evaluates the objective L = sum_i r_i * y_i accumulated in float64 with
// fixed random weights r, and compares (L+ - L-) / 2h against the analytic gradient from
// backward(r). Elements are sampled (every element of small tensors). Convolutions run with
// whatever algorithm the backend picks; Winograd's larger rounding needs h around 1e-2.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "models/layers/layer.h"

namespace trainer::testing {

using models::Layer;
using models::Mode;
using models::ParameterStore;
using models::Tensor;

struct LayerHarness {
  explicit LayerHarness(models::Backend& backend = models::cpu_backend()) : ctx{backend, params, buffers} {}
  ParameterStore params{true};
  ParameterStore buffers{false};
  models::LayerContext ctx;
};

inline std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.f, float min_abs = 0.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = normal(rng);
    if (min_abs > 0.f) x = std::copysign(min_abs + std::fabs(x), x);  // keep away from kinks at 0
  }
  return v;
}

struct GradCheckOptions {
  double h = 1e-2;
  double rtol = 1e-2;
  double atol = 1e-3;
  int max_checks_per_tensor = 64;
};

// Runs the check on `layer` for input x (shape given). Parameters must be allocated and set.
inline void check_layer_gradients(Layer& layer, LayerHarness& harness, const models::Shape& x_shape,
                                  std::vector<float> x_data, const GradCheckOptions& opt = {},
                                  models::Layout x_layout = models::Layout::kChannelsLast) {
  Tensor x{x_data.data(), x_shape, x_layout};
  const Tensor& y0 = layer.forward(x, Mode::kTrain);
  std::vector<float> r = random_vector(y0.numel(), 99);
  Tensor dy{r.data(), y0.shape, y0.layout};
  const Tensor& dx_ref = layer.backward(dy);
  std::vector<float> dx(dx_ref.data, dx_ref.data + dx_ref.numel());
  std::vector<float> dparams(harness.params.grads(), harness.params.grads() + harness.params.size());

  auto objective = [&]() {
    const Tensor& y = layer.forward(x, Mode::kTrain);
    double sum = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(r[i]) * y.data[i];
    return sum;
  };
  // A coordinate whose +-h interval holds a kink (a ReLU or max switching) has one-sided slopes
  // that disagree; such points are skipped, and the test fails if more than 3% of them are.
  int64_t checked = 0, skipped = 0;
  auto check = [&](const std::string& what, float* values, const float* analytic, int64_t n) {
    const int64_t step = std::max<int64_t>(1, n / opt.max_checks_per_tensor);
    const double center = objective();
    for (int64_t i = 0; i < n; i += step) {
      const float saved = values[i];
      values[i] = static_cast<float>(saved + opt.h);
      const double plus = objective();
      values[i] = static_cast<float>(saved - opt.h);
      const double minus = objective();
      values[i] = saved;
      const double numeric = (plus - minus) / (2 * opt.h);
      const double right = (plus - center) / opt.h, left = (center - minus) / opt.h;
      ++checked;
      if (std::fabs(right - left) > 0.1 * (std::fabs(numeric) + 0.1)) {
        ++skipped;
        continue;
      }
      INFO(what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric);
      CHECK(std::fabs(analytic[i] - numeric) <= opt.atol + opt.rtol * std::fabs(numeric));
    }
  };
  check("input", x_data.data(), dx.data(), static_cast<int64_t>(x_data.size()));
  for (const auto& view : harness.params.views())
    check(view.name, harness.params.values() + view.offset, dparams.data() + view.offset, view.numel());
  INFO("skipped " << skipped << " of " << checked << " coordinates next to a kink");
  CHECK(skipped * 100 <= checked * 3);
}

}  // namespace trainer::testing
