// Host memory as a device that counts what is copied across: a staged communicator over it must
// move every call's data through copies (comm/staged_communicator.h), never hand the caller's
// buffer to MPI directly, which on a GPU would be a device pointer. Shared by staged_comm_test and
// sync_test.
#pragma once

#include <cstdint>
#include <string>

#include "models/device_memory.h"

namespace trainer::testing {

class CountingMemory final : public models::DeviceMemory {
 public:
  // Over host memory, or over `under` (the device-like CPU's guarded memory, guarded_memory.h).
  CountingMemory() : under_(models::host_memory()) {}
  explicit CountingMemory(models::DeviceMemory& under) : under_(under) {}
  std::string name() const override { return "counting"; }
  void* allocate(size_t bytes) override { return under_.allocate(bytes); }
  void free(void* p) override { under_.free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    to_device += static_cast<int64_t>(bytes);
    under_.copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    to_host += static_cast<int64_t>(bytes);
    under_.copy_to_host(dst, src, bytes);
  }
  void fill(int64_t n, float value, float* y) override { under_.fill(n, value, y); }
  void synchronize() override { ++synchronizations; }

  int64_t to_device = 0, to_host = 0, synchronizations = 0;

 private:
  models::DeviceMemory& under_;
};

}  // namespace trainer::testing
