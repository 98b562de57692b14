#pragma once

#include "models/layers/batch_norm.h"
#include "models/layers/sequence.h"

namespace trainer::models {

// Batch normalization of every valid step of a padded batch {T, N, C}: DeepSpeech 2's
// SequenceWise(BatchNorm1d), with statistics over the sum(lengths) valid frames only, so padding
// never shifts them (deepspeech.pytorch normalizes over all T*N rows, padding included). Padding
// rows of the output are zero. The valid rows are packed into {frames, C} and normalized by a
// BatchNorm2d, whose parameters and running statistics carry this layer's name (<name>.weight,
// .bias, .running_mean, .running_var).
class SequenceBatchNorm final : public SequenceLayer {
 public:
  SequenceBatchNorm(LayerContext ctx, const std::string& name, const BatchNormOptions& options);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override { bn_.init(rng); }

 private:
  LayerContext ctx_;
  int64_t channels_;
  BatchNorm2d bn_;
  const int32_t* lengths_ = nullptr;
  Shape shape_;
  OwnedTensor packed_{ctx_.backend}, packed_grad_{ctx_.backend}, y_{ctx_.backend}, dx_{ctx_.backend};
};

}  // namespace trainer::models
