#include "models/layers/pool2d.h"

#include <stdexcept>

namespace trainer::models {

const Tensor& Pool2d::forward(const Tensor& x, Mode mode) {
  if (x.rank() != 4) throw std::invalid_argument("Pool2d: expected {N, C, H, W}, got " + shape_string(x.shape));
  PoolGeometry g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), opt_.kernel, opt_.kernel, opt_.stride,
                 opt_.stride, opt_.pad, opt_.pad, opt_.kind, x.layout, x.dtype};
  if (opt_.global) {
    g.kernel_h = g.stride_h = x.dim(2);
    g.kernel_w = g.stride_w = x.dim(3);
    g.pad_h = g.pad_w = 0;
  }
  op_ = &ops_.get(g, [this](const PoolGeometry& geometry) { return ctx_.backend.make_pool(geometry); });
  x_ = x;
  Tensor& y = y_.resize({g.batch, g.channels, g.out_h(), g.out_w()}, g.layout, g.dtype);
  op_->forward(x.data, y.data, mode == Mode::kTrain);
  return y;
}

const Tensor& Pool2d::backward(const Tensor& dy) {
  Tensor& dx = dx_.resize(x_.shape, x_.layout, x_.dtype);
  op_->backward(dy.data, dx.data);
  return dx;
}

}  // namespace trainer::models
