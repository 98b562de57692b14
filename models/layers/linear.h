#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// y = x W^T + b over {N, in}; W {out, in} as PyTorch. Initialization as PyTorch's nn.Linear:
// uniform(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
class Linear final : public Layer {
 public:
  Linear(LayerContext ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias = true);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;
  double forward_flops() const override { return x_.data ? 2.0 * x_.dim(0) * in_ * out_ : 0; }

 private:
  LayerContext ctx_;
  int64_t in_, out_;
  int weight_ = -1, bias_ = -1;
  Tensor x_;  // a copy of the input view: callers may pass temporaries
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
