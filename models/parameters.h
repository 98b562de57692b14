// One flat parameter buffer and one flat gradient buffer per model, with a table of named views.
//
// Layers declare their tensors while the model is built (name and shape); the store then allocates
// one contiguous buffer, and each declared tensor is a view at a fixed offset. Optimizers, gradient
// sync, checkpoints and error-feedback residuals all work on the flat buffers; layer-wise methods
// (PowerSGD, per-tensor statistics) walk the views. The same class holds non-trainable state
// (batch-norm running statistics) with has_grads = false.
//
// The flat buffers live on the device given to allocate() (a Backend; GPU memory for a GPU backend). Layers set
// initial values on the host: allocate() also makes a zeroed host copy of the values, which
// initial_value() views, and upload_initial_values() copies it to the device and frees it.
#pragma once

#include <string>
#include <vector>

#include "models/device_memory.h"
#include "models/tensor.h"

namespace trainer::models {

struct ParamView {
  std::string name;  // dotted path as in PyTorch's state_dict, e.g. "layer1.0.conv1.weight"
  int64_t offset = 0;  // in elements into the flat buffer
  Shape shape;
  int64_t numel() const { return models::numel(shape); }
};

class ParameterStore {
 public:
  explicit ParameterStore(bool has_grads) : has_grads_(has_grads) {}
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Declares a tensor and returns its id. Views are packed back to back with no padding, so the flat
  // buffer is exactly the parameter count (a dense step sends exactly 4 x count bytes).
  int declare(const std::string& name, const Shape& shape);
  // Allocates the flat buffers on `memory` (the model's backend), zero-filled, and the host copy for
  // initialization. No declarations after this.
  void allocate(DeviceMemory& memory);
  // A tensor of the host copy, between allocate() and upload_initial_values().
  Tensor initial_value(int id);
  // Copies the host copy to the device buffer (waiting for the copy) and frees it.
  void upload_initial_values();

  Tensor value(int id) { return {values_.data() + views_.at(id).offset, views_[id].shape}; }
  Tensor grad(int id) { return {grads_.data() + views_.at(id).offset, views_[id].shape}; }

  float* values() { return values_.data(); }
  const float* values() const { return values_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // Elements in the flat buffers: the model's parameter count.
  int64_t size() const { return size_; }
  bool has_grads() const { return has_grads_; }
  bool allocated() const { return allocated_; }
  // The device the buffers live on (after allocate()).
  DeviceMemory& memory() const;
  // The values copied to the host, and back from `bytes` (at most size() floats) of host memory,
  // through the backend's copies (waiting for them): checkpoints and tests.
  std::vector<float> host_values() const;
  void copy_values_from_host(const void* host, size_t bytes);
  const std::vector<ParamView>& views() const { return views_; }
  // The id of a named tensor, or -1.
  int find(const std::string& name) const;

 private:
  bool has_grads_;
  bool allocated_ = false;
  int64_t size_ = 0;
  std::vector<ParamView> views_;
  DeviceBuffer values_;
  DeviceBuffer grads_;
  std::vector<float> initial_values_;
};

}  // namespace trainer::models
