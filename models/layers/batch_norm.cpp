#include "models/layers/batch_norm.h"

#include <algorithm>
#include <stdexcept>

namespace trainer::models {

BatchNorm2d::BatchNorm2d(LayerContext ctx, const std::string& name, const BatchNormOptions& options)
    : ctx_(ctx), opt_(options) {
  weight_ = ctx.params.declare(name + ".weight", {opt_.channels});
  bias_ = ctx.params.declare(name + ".bias", {opt_.channels});
  running_mean_ = ctx.buffers.declare(name + ".running_mean", {opt_.channels});
  running_var_ = ctx.buffers.declare(name + ".running_var", {opt_.channels});
  batch_mean_.resize(opt_.channels);
  batch_var_.resize(opt_.channels);
}

void BatchNorm2d::init(Rng&) {
  for (int64_t c = 0; c < opt_.channels; ++c) {
    ctx_.params.initial_value(weight_).data[c] = 1.f;
    ctx_.params.initial_value(bias_).data[c] = 0.f;
    ctx_.buffers.initial_value(running_mean_).data[c] = 0.f;
    ctx_.buffers.initial_value(running_var_).data[c] = 1.f;
  }
}

const Tensor& BatchNorm2d::forward(const Tensor& x, Mode mode) {
  if ((x.rank() != 4 && x.rank() != 2) || x.dim(1) != opt_.channels)
    throw std::invalid_argument("BatchNorm2d: expected input {N, " + std::to_string(opt_.channels) +
                                ", ...}, got " + shape_string(x.shape));
  BatchNormGeometry g{x.dim(0), x.dim(1), x.rank() == 4 ? x.dim(2) : 1, x.rank() == 4 ? x.dim(3) : 1, opt_.eps,
                      opt_.relu, opt_.frozen && mode == Mode::kTrain, x.layout, x.dtype};
  op_ = &ops_.get(g, [this](const BatchNormGeometry& geometry) { return ctx_.backend.make_batchnorm(geometry); });
  x_ = x;
  Tensor& y = y_.resize(x.shape, x.layout, x.dtype);
  const float* gamma = ctx_.params.value(weight_).data;
  const float* beta = ctx_.params.value(bias_).data;
  float* running_mean = ctx_.buffers.value(running_mean_).data;
  float* running_var = ctx_.buffers.value(running_var_).data;
  if (mode == Mode::kEval) {
    op_->forward_inference(x.data, gamma, beta, running_mean, running_var, y.data);
    return y;
  }
  if (opt_.frozen) {
    // The statistics the normalization (and backward) use are the running ones, left unchanged.
    ctx_.backend.copy(opt_.channels, running_mean, batch_mean_.data());
    ctx_.backend.copy(opt_.channels, running_var, batch_var_.data());
    op_->forward_training(x.data, gamma, beta, y.data, batch_mean_.data(), batch_var_.data());
    return y;
  }
  op_->forward_training(x.data, gamma, beta, y.data, batch_mean_.data(), batch_var_.data());
  const int64_t count = g.batch * g.h * g.w;
  const float unbias = count > 1 ? static_cast<float>(count) / static_cast<float>(count - 1) : 1.f;
  // On the backend: the statistics live on its device.
  ctx_.backend.batchnorm_update_running(opt_.channels, opt_.momentum, unbias, batch_mean_.data(), batch_var_.data(),
                                        running_mean, running_var);
  return y;
}

const Tensor& BatchNorm2d::backward(const Tensor& dy) {
  Tensor& dx = dx_.resize(x_.shape, x_.layout, x_.dtype);
  op_->backward(x_.data, dy.data, ctx_.params.value(weight_).data, ctx_.params.value(bias_).data,
                batch_mean_.data(), batch_var_.data(),
                dx.data, ctx_.params.grad(weight_).data, ctx_.params.grad(bias_).data);
  return dx;
}

}  // namespace trainer::models
