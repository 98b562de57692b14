#include "models/layers/conv2d.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {

Conv2d::Conv2d(LayerContext ctx, const std::string& name, const Conv2dOptions& options)
    : ctx_(ctx), opt_(options) {
  weight_ = ctx.params.declare(name + ".weight",
                               {opt_.out_channels, opt_.in_channels, opt_.kernel_h, opt_.kernel_w});
  if (opt_.bias) bias_ = ctx.params.declare(name + ".bias", {opt_.out_channels});
}

void Conv2d::init(Rng& rng) {
  Tensor w = ctx_.params.initial_value(weight_);
  const double fan_out = static_cast<double>(opt_.out_channels * opt_.kernel_h * opt_.kernel_w);
  std::normal_distribution<float> normal(0.f, static_cast<float>(std::sqrt(2.0 / fan_out)));
  for (int64_t i = 0; i < w.numel(); ++i) w.data[i] = normal(rng);
  if (bias_ >= 0) {
    Tensor b = ctx_.params.initial_value(bias_);
    for (int64_t i = 0; i < b.numel(); ++i) b.data[i] = 0.f;
  }
}

const Tensor& Conv2d::forward(const Tensor& x, Mode) {
  if (x.rank() != 4 || x.dim(1) != opt_.in_channels)
    throw std::invalid_argument("Conv2d: expected input {N, " + std::to_string(opt_.in_channels) +
                                ", H, W}, got " + shape_string(x.shape));
  ConvGeometry g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), opt_.out_channels, opt_.kernel_h, opt_.kernel_w,
                 opt_.stride_h, opt_.stride_w, opt_.pad_h, opt_.pad_w, opt_.bias,
                 x.layout, ctx_.backend.activation_layout(opt_.out_channels)};
  g.src_dtype = x.dtype;
  const bool bf16_out = x.dtype == DType::kBf16 || (opt_.start_bf16 && ctx_.backend.bf16_activations());
  g.dst_dtype = bf16_out ? DType::kBf16 : DType::kF32;
  op_ = &ops_.get(g, [this](const ConvGeometry& geometry) { return ctx_.backend.make_conv(geometry); });
  x_ = x;
  flops_ = 2.0 * g.batch * g.out_channels * g.out_h() * g.out_w() * g.in_channels * g.kernel_h * g.kernel_w;
  Tensor& y = y_.resize({g.batch, g.out_channels, g.out_h(), g.out_w()}, op_->output_layout(), g.dst_dtype);
  op_->forward(x.data, ctx_.params.value(weight_).data, bias_ >= 0 ? ctx_.params.value(bias_).data : nullptr,
               y.data);
  return y;
}

const Tensor& Conv2d::backward(const Tensor& dy) {
  if (dy.dtype != y_.view().dtype) throw std::logic_error("Conv2d: the output gradient's dtype differs from the output's");
  op_->backward_weights(x_.data, dy.data, ctx_.params.grad(weight_).data,
                        bias_ >= 0 ? ctx_.params.grad(bias_).data : nullptr);
  if (!opt_.input_gradient) return no_gradient_;
  Tensor& dx = dx_.resize(x_.shape, x_.layout, x_.dtype);
  op_->backward_data(dy.data, ctx_.params.value(weight_).data, dx.data);
  return dx;
}

}  // namespace trainer::models
