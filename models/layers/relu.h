#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

class ReLU final : public Layer {
 public:
  explicit ReLU(LayerContext ctx) : ctx_(ctx) {}
  const Tensor& forward(const Tensor& x, Mode) override {
    Tensor& y = y_.resize(x.shape, x.layout);
    ctx_.backend.relu_forward(x.numel(), x.data, y.data);
    return y;
  }
  const Tensor& backward(const Tensor& dy) override {
    Tensor& dx = dx_.resize(dy.shape, dy.layout);
    ctx_.backend.relu_backward(dy.numel(), y_.view().data, dy.data, dx.data);
    return dx;
  }

 private:
  LayerContext ctx_;
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
