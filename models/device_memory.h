// Memory and ordering on a device: the part of the backend seam (models/backend.h) that buffers,
// parameter stores, checkpoints and (later) device communicators need, apart from the compute ops.
//
// Every copy and every op of a backend is enqueued, in call order, on its one stream. Calls may
// return before their results exist; a reader on the host waits with synchronize(). On the CPU the
// stream is trivial: everything has finished when the call returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainer::models {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // "cpu" or "cuda": the runtime.device value that selects this device.
  virtual std::string name() const = 0;
  // True when this memory is the host's: its pointers can be read and written by host code, passed
  // to MPI as they are, and every call has finished when it returns. Code that must treat device
  // memory differently asks this, never the name. A memory is a device's unless it says otherwise
  // (the tests' counting memories stand in for devices).
  virtual bool is_host() const { return false; }
  // `bytes` of device memory, 64-byte aligned (at least). Throws std::bad_alloc when there is none.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // Host <-> device copies, asynchronous on the stream: `src` (host) must stay unchanged and `dst`
  // (host) unread until synchronize().
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // y[0, n) = value.
  virtual void fill(int64_t n, float value, float* y) = 0;
  // Waits until everything enqueued so far has finished.
  virtual void synchronize() = 0;
  // The stream's native handle (a cudaStream_t for CUDA) for libraries that enqueue their own work
  // on it in order with ours (NCCL, comm/cuda/nccl_communicator.h); null where there is none (the
  // CPU, whose calls finish when they return).
  virtual void* stream_handle() { return nullptr; }
};

// Host memory as a device (the CPU backend's memory; also what tools without a compute backend,
// such as the checkpoint fuzzer, allocate parameter stores in). models/cpu/host_memory.cpp.
DeviceMemory& host_memory();

// Copies of n floats between host and device memory that wait for the copy: for the rare places
// that read or write device state on the host (checkpoints, optimizer state, tests).
void copy_to_host(DeviceMemory& memory, const float* device, int64_t n, float* host);
void copy_to_device(DeviceMemory& memory, const float* host, int64_t n, float* device);

}  // namespace trainer::models
