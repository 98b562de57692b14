#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// {N, C, H, W} -> {N, C*H*W} in PyTorch's order (c, h, w), so the next Linear's weights mean what
// they mean in PyTorch. Channels-last data needs a transpose unless H = W = 1, where it is a view.
class Flatten final : public Layer {
 public:
  explicit Flatten(LayerContext ctx) : ctx_(ctx) {}
  const Tensor& forward(const Tensor& x, Mode) override {
    in_shape_ = x.shape;
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
    if (h * w == 1) {
      y_view_ = {x.data, {n, c}};
      return y_view_;
    }
    Tensor& y = y_.resize({n, c * h * w});
    ctx_.backend.nhwc_to_nchw(n, c, h, w, x.data, y.data);
    return y;
  }
  const Tensor& backward(const Tensor& dy) override {
    const int64_t n = in_shape_[0], c = in_shape_[1], h = in_shape_[2], w = in_shape_[3];
    if (h * w == 1) {
      dx_view_ = {dy.data, in_shape_};
      return dx_view_;
    }
    Tensor& dx = dx_.resize(in_shape_);
    ctx_.backend.nchw_to_nhwc(n, c, h, w, dy.data, dx.data);
    return dx;
  }

 private:
  LayerContext ctx_;
  Shape in_shape_;
  Tensor y_view_, dx_view_;
  OwnedTensor y_, dx_;
};

}  // namespace trainer::models
