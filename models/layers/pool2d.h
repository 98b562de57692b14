#pragma once

#include "models/layers/layer.h"

namespace trainer::models {

struct Pool2dOptions {
  PoolKind kind = PoolKind::kMax;
  int64_t kernel = 2, stride = 2, pad = 0;
  bool global = false;  // kernel = the whole input plane (global average pooling), output {N, C, 1, 1}
};

class Pool2d final : public Layer {
 public:
  Pool2d(LayerContext ctx, const Pool2dOptions& options) : ctx_(ctx), opt_(options) {}
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;

 private:
  LayerContext ctx_;
  Pool2dOptions opt_;
  OpCache<PoolGeometry, PoolOp> ops_;
  PoolOp* op_ = nullptr;
  Tensor x_;  // a copy of the input view: callers may pass temporaries
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
