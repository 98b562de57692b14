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
  std::string name() const override { return "counting"; }
  void* allocate(size_t bytes) override { return models::host_memory().allocate(bytes); }
  void free(void* p) override { models::host_memory().free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    to_device += static_cast<int64_t>(bytes);
    models::host_memory().copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    to_host += static_cast<int64_t>(bytes);
    models::host_memory().copy_to_host(dst, src, bytes);
  }
  void fill(int64_t n, float value, float* y) override { models::host_memory().fill(n, value, y); }
  void synchronize() override { ++synchronizations; }

  int64_t to_device = 0, to_host = 0, synchronizations = 0;
};

}  // namespace trainer::testing
