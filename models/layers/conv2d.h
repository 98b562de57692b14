#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

struct Conv2dOptions {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kernel_h = 3, kernel_w = 3, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool bias = false;
  // A network's first convolution: write bf16 output where the backend keeps bf16 activations
  // (Backend::bf16_activations; the image networks set it). A convolution whose input is bf16
  // always writes bf16, so the rest of such a network follows.
  bool start_bf16 = false;
  // Whether backward computes the input's gradient: not for a network's first convolution, whose
  // input is data (DeepSpeech's spectrogram: there backward_data of the 1-channel input took a
  // third of a small model's step). Without it backward returns an empty tensor.
  bool input_gradient = true;
};

// 2-D convolution over channels-last input {N, C, H, W}; weight {O, I, KH, KW} (+ bias {O}).
// Initialization: Kaiming normal (fan_out, ReLU gain) as torchvision's ResNets; bias zero.
class Conv2d final : public Layer {
 public:
  Conv2d(LayerContext ctx, const std::string& name, const Conv2dOptions& options);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;
  double forward_flops() const override { return flops_; }

 private:
  LayerContext ctx_;
  Conv2dOptions opt_;
  double flops_ = 0;
  int weight_ = -1, bias_ = -1;
  OpCache<ConvGeometry, ConvOp> ops_;
  ConvOp* op_ = nullptr;
  Tensor x_;  // a copy of the input view: callers may pass temporaries
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
  Tensor no_gradient_;  // what backward returns without input_gradient
};

}  // namespace trainer::models
