// A host batch where the model reads it: on the CPU backend the host arrays themselves (no copy, as
// before the device seam); on a GPU a copy in device buffers that only grow, enqueued on the
// backend's stream ahead of the forward pass that reads it.
#pragma once

#include <cstdint>
#include <cstring>

#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::app {

// One host array's place on the backend. The host array must stay unchanged until the backend next
// waits (the loss does, every step): the copy is enqueued, and a copy from pageable memory is
// staged by the driver before the call returns, but the device may read it later.
//
// pin(): a recorded step (trainer/step/step_graph.h) copies from pinned memory, so the batch is first
// copied there (stage); a replay then needs only stage(), and its recorded copy moves the rest.
template <typename T>
class DeviceCopy {
  static_assert(sizeof(T) == sizeof(float), "a device copy rides in a float buffer");

 public:
  explicit DeviceCopy(models::Backend& backend) : backend_(backend), buffer_(backend) {}
  ~DeviceCopy() {
    if (pinned_) backend_.step_capture()->free_pinned(pinned_);
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  void pin() { pin_ = !backend_.is_host() && backend_.step_capture() != nullptr; }
  const T* upload(const T* host, int64_t count) {
    if (backend_.is_host()) return data_ = host;
    float* device = buffer_.reserve(count);
    const T* from = stage(host, count);
    if (count > 0) backend_.copy_to_device(device, from, sizeof(T) * count);
    return data_ = reinterpret_cast<const T*>(device);
  }
  // The host half of upload: into the pinned staging when pinned (else nothing: the copy reads `host`).
  const T* stage(const T* host, int64_t count) {
    if (!pin_) return host;
    if (count > pinned_count_) {
      models::StepCapture& capture = *backend_.step_capture();
      if (pinned_) capture.free_pinned(pinned_);
      pinned_ = nullptr;
      pinned_ = static_cast<T*>(capture.allocate_pinned(sizeof(T) * count));
      pinned_count_ = count;
    }
    if (count > 0) std::memcpy(pinned_, host, sizeof(T) * count);
    return pinned_;
  }
  const T* data() const { return data_; }

 private:
  models::Backend& backend_;
  models::DeviceBuffer buffer_;
  const T* data_ = nullptr;
  bool pin_ = false;
  T* pinned_ = nullptr;
  int64_t pinned_count_ = 0;
};

// An image batch: images and labels.
class DeviceBatch {
 public:
  explicit DeviceBatch(models::Backend& backend) : images_(backend), labels_(backend) {}
  void pin() {
    images_.pin();
    labels_.pin();
  }
  void upload(const float* images, int64_t image_floats, const int32_t* labels, int64_t count) {
    images_.upload(images, image_floats);
    labels_.upload(labels, count);
  }
  void stage(const float* images, int64_t image_floats, const int32_t* labels, int64_t count) {
    images_.stage(images, image_floats);
    labels_.stage(labels, count);
  }
  const float* images() const { return images_.data(); }
  const int32_t* labels() const { return labels_.data(); }

 private:
  DeviceCopy<float> images_;
  DeviceCopy<int32_t> labels_;
};

}  // namespace trainer::app
