#include "models/backend.h"

#include <tuple>

namespace trainer::models {

bool ConvGeometry::operator==(const ConvGeometry& o) const {
  return std::tie(batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, stride_h, stride_w, pad_h,
                  pad_w, bias, src_layout, dst_layout) ==
         std::tie(o.batch, o.in_channels, o.in_h, o.in_w, o.out_channels, o.kernel_h, o.kernel_w, o.stride_h,
                  o.stride_w, o.pad_h, o.pad_w, o.bias, o.src_layout, o.dst_layout);
}

bool BatchNormGeometry::operator==(const BatchNormGeometry& o) const {
  return std::tie(batch, channels, h, w, eps, fuse_relu, frozen_stats, layout) ==
         std::tie(o.batch, o.channels, o.h, o.w, o.eps, o.fuse_relu, o.frozen_stats, o.layout);
}

bool PoolGeometry::operator==(const PoolGeometry& o) const {
  return std::tie(batch, channels, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, kind, layout) ==
         std::tie(o.batch, o.channels, o.in_h, o.in_w, o.kernel_h, o.kernel_w, o.stride_h, o.stride_w, o.pad_h,
                  o.pad_w, o.kind, o.layout);
}

bool LstmGeometry::operator==(const LstmGeometry& o) const {
  return std::tie(input, hidden, layers, bidirectional) == std::tie(o.input, o.hidden, o.layers, o.bidirectional);
}

}  // namespace trainer::models
