#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// {N, C, H, W} -> {N, C*H*W} in PyTorch's order (c, h, w), so the next Linear's weights mean what
// they mean in PyTorch. That takes a reorder unless H = W = 1, where every layout the backend uses
// (channels-last, or 16-blocked with C a multiple of 16) already is {N, C}: a view. The output is
// fp32: bf16 activations (tensor.h) end here, widened by the reorder (and the gradient rounded back).
class Flatten final : public Layer {
 public:
  explicit Flatten(LayerContext ctx) : ctx_(ctx) {}
  const Tensor& forward(const Tensor& x, Mode) override {
    in_shape_ = x.shape;
    in_layout_ = x.layout;
    in_dtype_ = x.dtype;
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
    if (h * w == 1 && x.dtype == DType::kF32) {
      y_view_ = {x.data, {n, c}};
      return y_view_;
    }
    Tensor& y = y_.resize({n, c * h * w});
    ctx_.backend.to_nchw(x, y.data);
    return y;
  }
  const Tensor& backward(const Tensor& dy) override {
    if (in_shape_[2] * in_shape_[3] == 1 && in_dtype_ == DType::kF32) {
      dx_view_ = {dy.data, in_shape_, in_layout_};
      return dx_view_;
    }
    Tensor& dx = dx_.resize(in_shape_, in_layout_, in_dtype_);
    ctx_.backend.from_nchw(dy.data, dx);
    return dx;
  }

 private:
  LayerContext ctx_;
  Shape in_shape_;
  Layout in_layout_ = Layout::kChannelsLast;
  DType in_dtype_ = DType::kF32;
  Tensor y_view_, dx_view_;
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
