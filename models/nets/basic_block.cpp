#include "models/nets/basic_block.h"

#include <stdexcept>

#include "models/layers/shortcut_a.h"

namespace trainer::models {
namespace {

Conv2dOptions conv3x3(int64_t in, int64_t out, int64_t stride) {
  return {in, out, 3, 3, stride, stride, 1, 1, false};
}

}  // namespace

BasicBlock::BasicBlock(LayerContext ctx, const std::string& name, int64_t in_planes, int64_t planes,
                       int64_t stride, Shortcut shortcut, bool frozen_bn)
    : ctx_(ctx),
      conv1_(ctx, name + ".conv1", conv3x3(in_planes, planes, stride)),
      bn1_(ctx, name + ".bn1", {planes, 1e-5f, 0.1f, /*relu=*/true, frozen_bn}),
      conv2_(ctx, name + ".conv2", conv3x3(planes, planes, 1)),
      bn2_(ctx, name + ".bn2", {planes, 1e-5f, 0.1f, false, frozen_bn}) {
  if (shortcut == Shortcut::kOptionA) {
    shortcut_ = std::make_unique<ShortcutA>(ctx, stride, (planes - in_planes) / 2);
  } else if (shortcut == Shortcut::kProjection) {
    shortcut_ = std::make_unique<Conv2d>(ctx, name + ".shortcut.0",
                                         Conv2dOptions{in_planes, planes, 1, 1, stride, stride, 0, 0, false});
    shortcut_bn_ = std::make_unique<BatchNorm2d>(ctx, name + ".shortcut.1",
                                                 BatchNormOptions{planes, 1e-5f, 0.1f, false, frozen_bn});
  }
}

void BasicBlock::init(Rng& rng) {
  conv1_.init(rng);
  bn1_.init(rng);
  conv2_.init(rng);
  bn2_.init(rng);
  if (shortcut_) shortcut_->init(rng);
  if (shortcut_bn_) shortcut_bn_->init(rng);
}

const Tensor& BasicBlock::forward(const Tensor& x, Mode mode) {
  x_ = x;
  const Tensor& main = bn2_.forward(conv2_.forward(bn1_.forward(conv1_.forward(x, mode), mode), mode), mode);
  const Tensor* side = &x;
  if (shortcut_) side = &shortcut_->forward(x, mode);
  if (shortcut_bn_) side = &shortcut_bn_->forward(*side, mode);
  if (side->shape != main.shape) throw std::logic_error("BasicBlock: shortcut and residual branch disagree in shape");
  side_layout_ = side->layout;
  side = &in_layout(*side, main.layout, side_converted_);
  Tensor& y = y_.resize(main.shape, main.layout, main.dtype);
  ctx_.backend.add_relu_tensors(main, *side, y);
  return y;
}

const Tensor& BasicBlock::in_layout(const Tensor& t, Layout layout, OwnedTensor& buffer) {
  if (t.layout == layout) return t;
  Tensor& converted = buffer.resize(t.shape, layout, t.dtype);
  ctx_.backend.convert_layout(t, converted);
  return converted;
}

const Tensor& BasicBlock::backward(const Tensor& dy) {
  Backend& be = ctx_.backend;
  Tensor& dsum = dsum_.resize(dy.shape, dy.layout, dy.dtype);
  be.relu_backward_tensors(y_.view(), dy, dsum);
  const Tensor& dx_main = conv1_.backward(bn1_.backward(conv2_.backward(bn2_.backward(dsum))));
  const Tensor* dx_side = &in_layout(dsum, side_layout_, dside_);
  if (shortcut_bn_) dx_side = &shortcut_bn_->backward(*dx_side);
  if (shortcut_) dx_side = &shortcut_->backward(*dx_side);
  dx_side = &in_layout(*dx_side, x_.layout, dx_side_converted_);
  Tensor& dx = dx_.resize(x_.shape, x_.layout, x_.dtype);
  be.add_tensors(dx_main, *dx_side, dx);
  return dx;
}

}  // namespace trainer::models
