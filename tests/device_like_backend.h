// The CPU backend dressed as a device: every op is the CPU backend's, but is_host() is false and its
// memory counts the copies across, so code that branches on where a backend's memory is (the speech
// models' uploads of tokens and indices, DeepSpeech's decoding copy, the trainer's DeviceCopy) runs
// its device path here, on machines without a GPU, and must give the CPU path's bits.
#pragma once

#include <memory>
#include <string>

#include "counting_memory.h"
#include "models/forwarding_backend.h"

namespace trainer::models {

class DeviceLikeCpu final : public ForwardingBackend {
 public:
  DeviceLikeCpu() : ForwardingBackend(cpu_backend()) {}
  // ---- DeviceMemory: host memory that counts copies (counting_memory.h), not host to its users.
  std::string name() const override { return "device-like cpu"; }
  bool is_host() const override { return false; }
  void* allocate(size_t bytes) override { return memory.allocate(bytes); }
  void free(void* p) override { memory.free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { memory.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { memory.copy_to_host(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { memory.fill(n, value, y); }
  void synchronize() override { memory.synchronize(); }
  // Its calls finish when they return, so a second stream is the same memory with no-op marks.
  std::unique_ptr<DeviceStream> make_stream() override { return make_synchronous_stream(*this); }
  // ---- Every op: the CPU backend's (ForwardingBackend).

  testing::CountingMemory memory;
};

}  // namespace trainer::models
