#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

struct BatchNormOptions {
  int64_t channels = 0;
  float eps = 1e-5f;
  float momentum = 0.1f;  // PyTorch's convention: running = (1 - momentum) * running + momentum * batch
  bool relu = false;      // fuse a ReLU after the normalization (one pass instead of two)
  // Train with the running statistics instead of batch statistics (and leave them unchanged):
  // PyTorch's BatchNorm in eval mode under a training loop ("frozen BN", as in fine-tuning).
  bool frozen = false;
};

// BatchNorm2d over {N, C, H, W} (also {N, C}). Training normalizes with batch statistics and
// updates running statistics (unbiased variance, as PyTorch); evaluation uses the running
// statistics, and so does training when `frozen`. weight (gamma) starts at 1, bias (beta) at 0.
class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(LayerContext ctx, const std::string& name, const BatchNormOptions& options);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;

 private:
  LayerContext ctx_;
  BatchNormOptions opt_;
  int weight_ = -1, bias_ = -1, running_mean_ = -1, running_var_ = -1;
  OpCache<BatchNormGeometry, BatchNormOp> ops_;
  BatchNormOp* op_ = nullptr;
  Tensor x_;  // a copy of the input view: callers may pass temporaries
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
  DeviceBuffer batch_mean_{ctx_.backend}, batch_var_{ctx_.backend};
};

}  // namespace trainer::models
