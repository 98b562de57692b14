// Owning float storage on a device (host memory for the CPU backend), allocated and freed through
// its DeviceMemory (every Backend is one). ParameterStore and OwnedTensor hold their data in these; HostBuffer
// (models/tensor.h) stays for memory the host itself reads and writes (loader batches, staging).
#pragma once

#include <cstdint>
#include <vector>

namespace trainer::models {

class DeviceMemory;

class DeviceBuffer {
 public:
  // Empty and bound to no device: it must be assigned one before it can grow.
  DeviceBuffer() = default;
  explicit DeviceBuffer(DeviceMemory& memory) : memory_(&memory) {}
  DeviceBuffer(DeviceMemory& memory, int64_t n) : memory_(&memory) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }

  // Sets the size to n elements; reallocates only to grow, and contents are undefined after a
  // growth (the old storage is freed, nothing is copied).
  void resize(int64_t n);
  // Grows only. Returns data().
  float* reserve(int64_t n) {
    if (n > capacity_) resize(n);
    return data_;
  }
  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  DeviceMemory* memory() const { return memory_; }

 private:
  void release();
  void swap(DeviceBuffer& other) noexcept;

  DeviceMemory* memory_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
};

// The first `count` values of `buffer` (all of them: -1) as a host vector, waiting for the copy:
// for the state a method saves and for tests.
std::vector<float> host_copy(const DeviceBuffer& buffer, int64_t count = -1);

}  // namespace trainer::models
