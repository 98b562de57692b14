#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// Option A of He et al. 2016 (CIFAR ResNets): the identity shortcut of a block that halves the
// resolution and doubles the width takes every `stride`-th pixel and zero-pads `pad` channels on
// each side. No parameters.
class ShortcutA final : public Layer {
 public:
  ShortcutA(LayerContext ctx, int64_t stride, int64_t pad) : ctx_(ctx), stride_(stride), pad_(pad) {}
  const Tensor& forward(const Tensor& x, Mode) override {
    in_shape_ = x.shape;
    in_layout_ = x.layout;
    in_dtype_ = x.dtype;
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
    Tensor& y = y_.resize({n, c + 2 * pad_, (h + stride_ - 1) / stride_, (w + stride_ - 1) / stride_},
                          ctx_.backend.activation_layout(c + 2 * pad_), x.dtype);
    ctx_.backend.shortcut_a_forward(x, stride_, pad_, y);
    return y;
  }
  const Tensor& backward(const Tensor& dy) override {
    Tensor& dx = dx_.resize(in_shape_, in_layout_, in_dtype_);
    ctx_.backend.shortcut_a_backward(dy, stride_, pad_, dx);
    return dx;
  }

 private:
  LayerContext ctx_;
  int64_t stride_, pad_;
  Shape in_shape_;
  Layout in_layout_ = Layout::kChannelsLast;
  DType in_dtype_ = DType::kF32;
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
