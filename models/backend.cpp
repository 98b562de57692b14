#include "models/backend.h"

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <tuple>

namespace trainer::models {

bool ConvGeometry::operator==(const ConvGeometry& o) const {
  return std::tie(batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h,
                  pad_w, bias, src_layout, dst_layout, src_dtype, dst_dtype) ==
         std::tie(o.batch, o.in_channels, o.in_h, o.in_w, o.out_channels, o.kernel_h, o.kernel_w, o.stride_h,
                  o.stride_w, o.pad_h, o.pad_w, o.bias, o.src_layout, o.dst_layout, o.src_dtype, o.dst_dtype);
}

bool BatchNormGeometry::operator==(const BatchNormGeometry& o) const {
  return std::tie(batch, channels, h, w, eps, fuse_relu, frozen_stats, layout, dtype) ==
         std::tie(o.batch, o.channels, o.h, o.w, o.eps, o.fuse_relu, o.frozen_stats, o.layout, o.dtype);
}

bool PoolGeometry::operator==(const PoolGeometry& o) const {
  return std::tie(batch, channels, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, kind, layout,
                  dtype) ==
         std::tie(o.batch, o.channels, o.in_h, o.in_w, o.kernel_h, o.kernel_w, o.stride_h, o.stride_w, o.pad_h,
                  o.pad_w, o.kind, o.layout, o.dtype);
}

namespace {
void require_f32(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t->dtype != DType::kF32)
      throw std::logic_error(std::string(op) + ": this backend keeps no bf16 activations (Backend::bf16_activations)");
}
}  // namespace

void NnOps::add_relu_tensors(const Tensor& a, const Tensor& b, Tensor& y) {
  require_f32("add_relu_tensors", {&a, &b, &y});
  add(y.numel(), a.data, b.data, y.data);
  relu_forward(y.numel(), y.data, y.data);
}

void NnOps::relu_backward_tensors(const Tensor& y, const Tensor& dy, Tensor& dx) {
  require_f32("relu_backward_tensors", {&y, &dy, &dx});
  relu_backward(dx.numel(), y.data, dy.data, dx.data);
}

void NnOps::add_tensors(const Tensor& a, const Tensor& b, Tensor& y) {
  require_f32("add_tensors", {&a, &b, &y});
  add(y.numel(), a.data, b.data, y.data);
}

bool LstmGeometry::operator==(const LstmGeometry& o) const {
  return std::tie(input, hidden, layers, bidirectional) == std::tie(o.input, o.hidden, o.layers, o.bidirectional);
}

}  // namespace trainer::models
