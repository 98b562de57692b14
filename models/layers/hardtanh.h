#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// y = min(max(x, lo), hi), element-wise, any shape and layout; DeepSpeech's clipped ReLU is
// Hardtanh(0, 20). The gradient passes where lo < x < hi, as PyTorch's.
class Hardtanh final : public Layer {
 public:
  Hardtanh(LayerContext ctx, float lo, float hi) : ctx_(ctx), lo_(lo), hi_(hi) {}
  const Tensor& forward(const Tensor& x, Mode) override {
    Tensor& y = y_.resize(x.shape, x.layout);
    ctx_.backend.hardtanh_forward(x.numel(), lo_, hi_, x.data, y.data);
    return y;
  }
  const Tensor& backward(const Tensor& dy) override {
    Tensor& dx = dx_.resize(dy.shape, dy.layout);
    ctx_.backend.hardtanh_backward(dy.numel(), lo_, hi_, y_.view().data, dy.data, dx.data);
    return dx;
  }

 private:
  LayerContext ctx_;
  float lo_, hi_;
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
