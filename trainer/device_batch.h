// A host batch where the model reads it: on the CPU backend the host arrays themselves (no copy, as
// before the device seam); on a GPU a copy in device buffers that only grow, enqueued on the
// backend's stream ahead of the forward pass that reads it.
#pragma once

#include <cstdint>

#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::app {

// One host array's place on the backend. The host array must stay unchanged until the backend next
// waits (the loss does, every step): the copy is enqueued, and a copy from pageable memory is
// staged by the driver before the call returns, but the device may read it later.
template <typename T>
class DeviceCopy {
  static_assert(sizeof(T) == sizeof(float), "a device copy rides in a float buffer");

 public:
  explicit DeviceCopy(models::Backend& backend) : backend_(backend), buffer_(backend) {}
  const T* upload(const T* host, int64_t count) {
    if (backend_.is_host()) return data_ = host;
    float* device = buffer_.reserve(count);
    if (count > 0) backend_.copy_to_device(device, host, sizeof(T) * count);
    return data_ = reinterpret_cast<const T*>(device);
  }
  const T* data() const { return data_; }

 private:
  models::Backend& backend_;
  models::DeviceBuffer buffer_;
  const T* data_ = nullptr;
};

// An image batch: images and labels.
class DeviceBatch {
 public:
  explicit DeviceBatch(models::Backend& backend) : images_(backend), labels_(backend) {}
  void upload(const float* images, int64_t image_floats, const int32_t* labels, int64_t count) {
    images_.upload(images, image_floats);
    labels_.upload(labels, count);
  }
  const float* images() const { return images_.data(); }
  const int32_t* labels() const { return labels_.data(); }

 private:
  DeviceCopy<float> images_;
  DeviceCopy<int32_t> labels_;
};

}  // namespace trainer::app
