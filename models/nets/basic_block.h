#pragma once

#include <memory>

#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"

namespace trainer::models {

enum class Shortcut { kIdentity, kOptionA, kProjection };

// The basic residual block of He et al. 2016: conv3x3-BN-ReLU-conv3x3-BN, plus a shortcut, then
// ReLU. The shortcut is the identity, option A (subsample + zero channels; CIFAR ResNet-20/32/56)
// or a 1x1 convolution + BN projection (ResNet-18), chosen by the caller when the shape changes.
class BasicBlock final : public Layer {
 public:
  BasicBlock(LayerContext ctx, const std::string& name, int64_t in_planes, int64_t planes, int64_t stride,
             Shortcut shortcut, bool frozen_bn = false);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;
  double forward_flops() const override {
    return conv1_.forward_flops() + conv2_.forward_flops() + (shortcut_ ? shortcut_->forward_flops() : 0);
  }

 private:
  LayerContext ctx_;
  // Members in PyTorch's order, so the flat buffer holds conv1, bn1, conv2, bn2 like a state_dict.
  Conv2d conv1_;
  BatchNorm2d bn1_;  // with the block's first ReLU fused in
  Conv2d conv2_;
  BatchNorm2d bn2_;
  std::unique_ptr<Layer> shortcut_, shortcut_bn_;  // null for identity; bn only for projection
  // `t` in `layout`: t itself, or a copy reordered into `buffer`.
  const Tensor& in_layout(const Tensor& t, Layout layout, OwnedTensor& buffer);

  Tensor x_;  // a copy of the input view: callers may pass temporaries
  Layout side_layout_ = Layout::kChannelsLast;  // the shortcut's output layout
  OwnedTensor y_{ctx_.backend}, dsum_{ctx_.backend}, dx_{ctx_.backend};
  // Reorders for when the two branches' convolutions chose different layouts (Conv2d's op chooses).
  OwnedTensor side_converted_{ctx_.backend}, dside_{ctx_.backend}, dx_side_converted_{ctx_.backend};
};

}  // namespace trainer::models
