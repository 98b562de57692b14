#include "models/layers/linear.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {

Linear::Linear(LayerContext ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias)
    : ctx_(ctx), in_(in_features), out_(out_features) {
  weight_ = ctx.params.declare(name + ".weight", {out_, in_});
  if (bias) bias_ = ctx.params.declare(name + ".bias", {out_});
}

void Linear::init(Rng& rng) {
  const float bound = 1.f / std::sqrt(static_cast<float>(in_));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  Tensor w = ctx_.params.initial_value(weight_);
  for (int64_t i = 0; i < w.numel(); ++i) w.data[i] = uniform(rng);
  if (bias_ >= 0) {
    Tensor b = ctx_.params.initial_value(bias_);
    for (int64_t i = 0; i < b.numel(); ++i) b.data[i] = uniform(rng);
  }
}

const Tensor& Linear::forward(const Tensor& x, Mode) {
  if (x.rank() != 2 || x.dim(1) != in_)
    throw std::invalid_argument("Linear: expected input {N, " + std::to_string(in_) + "}, got " +
                                shape_string(x.shape));
  x_ = x;
  const int64_t n = x.dim(0);
  Tensor& y = y_.resize({n, out_});
  Backend& be = ctx_.backend;
  float beta = 0.f;
  if (bias_ >= 0) {
    be.broadcast_rows(n, out_, ctx_.params.value(bias_).data, y.data);
    beta = 1.f;
  }
  be.layer_gemm(false, true, n, out_, in_, 1.f, x.data, in_, ctx_.params.value(weight_).data, in_, beta, y.data, out_);
  return y;
}

const Tensor& Linear::backward(const Tensor& dy) {
  const int64_t n = x_.dim(0);
  Backend& be = ctx_.backend;
  be.layer_gemm(true, false, out_, in_, n, 1.f, dy.data, out_, x_.data, in_, 0.f, ctx_.params.grad(weight_).data, in_);
  if (bias_ >= 0) be.sum_rows(n, out_, dy.data, ctx_.params.grad(bias_).data);
  Tensor& dx = dx_.resize(x_.shape);
  be.layer_gemm(false, false, n, in_, out_, 1.f, dy.data, out_, ctx_.params.value(weight_).data, in_, 0.f, dx.data, in_);
  return dx;
}

}  // namespace trainer::models
