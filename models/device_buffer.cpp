#include "models/device_buffer.h"

#include <stdexcept>
#include <utility>

#include "models/device_memory.h"

namespace trainer::models {

void DeviceBuffer::resize(int64_t n) {
  if (n < 0) throw std::logic_error("DeviceBuffer: negative size");
  if (n > capacity_) {
    if (!memory_) throw std::logic_error("DeviceBuffer: grown before it was given a device");
    release();
    data_ = static_cast<float*>(memory_->allocate(static_cast<size_t>(n) * sizeof(float)));
    capacity_ = n;
  }
  size_ = n;
}

void DeviceBuffer::release() {
  if (data_) memory_->free(data_);
  data_ = nullptr;
  size_ = capacity_ = 0;
}

void DeviceBuffer::swap(DeviceBuffer& other) noexcept {
  std::swap(memory_, other.memory_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(capacity_, other.capacity_);
}

std::vector<float> host_copy(const DeviceBuffer& buffer, int64_t count) {
  if (count < 0) count = buffer.size();
  std::vector<float> host(static_cast<size_t>(count));
  if (count > 0) copy_to_host(*buffer.memory(), buffer.data(), count, host.data());
  return host;
}

}  // namespace trainer::models
