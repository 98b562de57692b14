#include "models/layers/sequence_batch_norm.h"

#include <numeric>
#include <stdexcept>

namespace trainer::models {

SequenceBatchNorm::SequenceBatchNorm(LayerContext ctx, const std::string& name, const BatchNormOptions& options)
    : ctx_(ctx), channels_(options.channels), bn_(ctx, name, options) {}

const Tensor& SequenceBatchNorm::forward(const Tensor& x, Mode mode) {
  if (x.rank() != 3 || x.dim(2) != channels_)
    throw std::invalid_argument("SequenceBatchNorm: expected input {T, N, " + std::to_string(channels_) +
                                "}, got " + shape_string(x.shape));
  lengths_ = lengths_for(x, "SequenceBatchNorm");
  shape_ = x.shape;
  const int64_t T = x.dim(0), N = x.dim(1);
  const int64_t frames = std::accumulate(lengths_, lengths_ + N, int64_t{0});
  if (frames == 0) throw std::invalid_argument("SequenceBatchNorm: a batch without a single valid frame");
  Tensor& packed = packed_.resize({frames, channels_});
  ctx_.backend.pack_sequences(T, N, channels_, lengths_, x.data, packed.data);
  const Tensor& normalized = bn_.forward(packed, mode);
  Tensor& y = y_.resize(shape_);
  ctx_.backend.unpack_sequences(T, N, channels_, lengths_, normalized.data, y.data);
  return y;
}

const Tensor& SequenceBatchNorm::backward(const Tensor& dy) {
  const int64_t T = shape_[0], N = shape_[1];
  Tensor& packed_grad = packed_grad_.resize(packed_.view().shape);
  ctx_.backend.pack_sequences(T, N, channels_, lengths_, dy.data, packed_grad.data);
  const Tensor& dpacked = bn_.backward(packed_grad);
  Tensor& dx = dx_.resize(shape_);
  ctx_.backend.unpack_sequences(T, N, channels_, lengths_, dpacked.data, dx.data);
  return dx;
}

}  // namespace trainer::models
