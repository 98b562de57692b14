#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

// Lookahead convolution (Wang et al. 2016, "Lookahead convolution layer for unidirectional
// recurrent neural networks"; DeepSpeech 2, section 3.5) over x {T, N, C}: every channel mixes its
// own next `context` steps, y[t, n, c] = sum_{k=0..context} w[c, k] * x[t + k, n, c], with x zero
// past T. No bias. Weight <name>.weight {C, context + 1}, initialized U(-1/sqrt(context + 1), ...)
// as deepspeech.pytorch's Lookahead. Padding needs no lengths: when x is zero past each
// sequence's length (an Lstm's output is), so is y.
class Lookahead final : public Layer {
 public:
  Lookahead(LayerContext ctx, const std::string& name, int64_t channels, int64_t context);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;
  double forward_flops() const override { return x_.data ? 2.0 * x_.numel() * (context_ + 1) : 0; }

 private:
  LayerContext ctx_;
  int64_t channels_, context_;
  int weight_ = -1;
  Tensor x_;  // a copy of the input view
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
