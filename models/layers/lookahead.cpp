#include "models/layers/lookahead.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {

Lookahead::Lookahead(LayerContext ctx, const std::string& name, int64_t channels, int64_t context)
    : ctx_(ctx), channels_(channels), context_(context) {
  if (context <= 0) throw std::invalid_argument("Lookahead " + name + ": context must be positive");
  weight_ = ctx.params.declare(name + ".weight", {channels, context + 1});
}

void Lookahead::init(Rng& rng) {
  const float bound = 1.f / std::sqrt(static_cast<float>(context_ + 1));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  Tensor w = ctx_.params.initial_value(weight_);
  for (int64_t i = 0; i < w.numel(); ++i) w.data[i] = uniform(rng);
}

const Tensor& Lookahead::forward(const Tensor& x, Mode) {
  if (x.rank() != 3 || x.dim(2) != channels_)
    throw std::invalid_argument("Lookahead: expected input {T, N, " + std::to_string(channels_) + "}, got " +
                                shape_string(x.shape));
  x_ = x;
  Tensor& y = y_.resize(x.shape);
  ctx_.backend.lookahead_forward(x.dim(0), x.dim(1), channels_, context_, x.data, ctx_.params.value(weight_).data,
                                 y.data);
  return y;
}

const Tensor& Lookahead::backward(const Tensor& dy) {
  Tensor& dx = dx_.resize(x_.shape);
  ctx_.backend.lookahead_backward(x_.dim(0), x_.dim(1), channels_, context_, x_.data,
                                  ctx_.params.value(weight_).data, dy.data, dx.data,
                                  ctx_.params.grad(weight_).data);
  return dx;
}

}  // namespace trainer::models
