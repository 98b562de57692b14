// Tensors are views: a pointer into storage someone else owns, plus a logical shape.
//
// Layout conventions:
// - image activations have logical shape {N, C, H, W}; their memory layout is a property of the
//   tensor (Layout below), chosen by the backend per channel count. Inputs arrive channels-last.
// - convolution weights are stored {O, I, KH, KW} as in PyTorch, so checkpoints interchange;
// - linear weights are {out, in} as in PyTorch; 2-D activations are {N, features} row-major.
// A gradient always has the layout of the tensor it is the gradient of.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "models/device_buffer.h"

namespace trainer::models {

using Shape = std::vector<int64_t>;

// Memory layouts of {N, C, H, W} activations (2-D tensors are always row-major).
//  - kChannelsLast: NHWC, for inputs and channel counts that are not a multiple of the block;
//  - kBlocked8 / kBlocked16: oneDNN's nChw8c / nChw16c (channels in blocks of 8 or 16, the block
//    innermost), which its JIT kernels want: 16 on AVX-512 (Winograd among them), 8 on AVX2. The
//    CPU backend asks oneDNN which one this machine's kernels use (cpu/dnnl_dispatch.h). Used only
//    when C is a multiple of the block, so there is never padding and numel() is the storage size
//    in every layout.
enum class Layout : uint8_t { kChannelsLast, kBlocked8, kBlocked16 };

// Channels per block of a blocked layout; 0 for channels-last.
inline int64_t channel_block(Layout layout) {
  switch (layout) {
    case Layout::kBlocked8: return 8;
    case Layout::kBlocked16: return 16;
    default: return 0;
  }
}

// "nhwc", "nChw8c" or "nChw16c": oneDNN's names, for messages and tests.
const char* layout_name(Layout layout);

inline int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape);

// The number format of an activation in memory. Everything is fp32 except, under runtime.precision
// = bf16 on a backend that keeps bf16 activations (Backend::bf16_activations), the image networks'
// activations and their gradients between the first convolution and the flatten before the
// classifier (models/nets/cifar_nets.cpp): bf16 there halves the memory traffic of batch norm, the
// element-wise ops and the convolutions' inputs, as PyTorch's autocast does. A bf16 tensor's `data`
// points at numel() 16-bit values (the float pointer type is only the storage's).
enum class DType : uint8_t { kF32, kBf16 };

const char* dtype_name(DType dtype);  // "f32", "bf16"

struct Tensor {
  float* data = nullptr;
  Shape shape;
  Layout layout = Layout::kChannelsLast;
  DType dtype = DType::kF32;

  int64_t numel() const { return models::numel(shape); }
  int64_t dim(size_t i) const { return shape.at(i); }
  size_t rank() const { return shape.size(); }
};

// Owning, 64-byte aligned float storage (host memory). Resizing keeps nothing.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(int64_t n) { resize(n); }
  void resize(int64_t n);
  // Grows only; contents are undefined after a growth. Returns data().
  float* reserve(int64_t n) {
    if (n > capacity_) resize(n);
    return data();
  }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
};

// An owning tensor: a DeviceBuffer on the device (backend) it was made for, plus a shape; used for the
// activations and gradients a layer keeps. There is no default constructor, so a layer cannot
// forget to say where its tensors live.
class OwnedTensor {
 public:
  explicit OwnedTensor(DeviceMemory& memory) : buffer_(memory) {}
  // Reshapes, reallocating only when the new shape needs more room.
  Tensor& resize(const Shape& shape, Layout layout = Layout::kChannelsLast, DType dtype = DType::kF32) {
    const int64_t n = models::numel(shape);
    view_.data = buffer_.reserve(dtype == DType::kBf16 ? (n + 1) / 2 : n);  // in floats
    view_.shape = shape;
    view_.layout = layout;
    view_.dtype = dtype;
    return view_;
  }
  Tensor& view() { return view_; }
  const Tensor& view() const { return view_; }

 private:
  DeviceBuffer buffer_;
  Tensor view_;
};

// Resizes a vector of owning tensors to n, new ones empty on `memory` (OwnedTensor has no default
// constructor, so std::vector::resize cannot make them).
inline void resize_owned(std::vector<OwnedTensor>& v, size_t n, DeviceMemory& memory) {
  if (v.size() > n) v.erase(v.begin() + static_cast<std::ptrdiff_t>(n), v.end());
  v.reserve(n);
  while (v.size() < n) v.emplace_back(memory);
}

}  // namespace trainer::models
