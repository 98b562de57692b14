// A host batch (images and labels) where the model reads it: on the CPU backend the host arrays
// themselves (no copy, as before the device seam); on a GPU a copy in device buffers that only grow,
// enqueued on the backend's stream ahead of the forward pass that reads it.
#pragma once

#include <cstdint>

#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::app {

class DeviceBatch {
 public:
  explicit DeviceBatch(models::Backend& backend) : backend_(backend), images_(backend), labels_(backend) {}

  // The host arrays must stay unchanged until the backend next waits (the loss does, every step).
  void upload(const float* images, int64_t image_floats, const int32_t* labels, int64_t count) {
    if (backend_.is_host()) {
      images_ptr_ = images;
      labels_ptr_ = labels;
      return;
    }
    static_assert(sizeof(int32_t) == sizeof(float), "labels ride in a float buffer");
    float* images_dev = images_.reserve(image_floats);
    float* labels_dev = labels_.reserve(count);
    backend_.copy_to_device(images_dev, images, sizeof(float) * image_floats);
    backend_.copy_to_device(labels_dev, labels, sizeof(int32_t) * count);
    images_ptr_ = images_dev;
    labels_ptr_ = reinterpret_cast<const int32_t*>(labels_dev);
  }
  const float* images() const { return images_ptr_; }
  const int32_t* labels() const { return labels_ptr_; }

 private:
  models::Backend& backend_;
  models::DeviceBuffer images_, labels_;
  const float* images_ptr_ = nullptr;
  const int32_t* labels_ptr_ = nullptr;
};

}  // namespace trainer::app
