// Memory and ordering on a device: the part of the backend seam (models/backend.h) that buffers,
// parameter stores, checkpoints and (later) device communicators need, apart from the compute ops.
//
// Every copy and every op of a backend is enqueued, in call order, on its one stream. Calls may
// return before their results exist; a reader on the host waits with synchronize(). On the CPU the
// stream is trivial: everything has finished when the call returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer::models {

class DeviceStream;

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
  // A second stream of this device for work that overlaps this one's (dense buckets' collectives
  // during backward, comm/sync/methods/dense/bucket_reducer.h); null where calls finish when they return (the
  // CPU: its overlap is a host thread).
  virtual std::unique_ptr<DeviceStream> make_stream() { return nullptr; }
};

// Another stream of a device (DeviceMemory::make_stream), as a DeviceMemory: its allocations are
// its owner's, and its copies, fills and synchronize() (and a communicator's calls made over it,
// Communicator::on_stream) run on the second stream, ordered with the owner's stream only through
// marks. Mark i is an event: record(i) marks everything enqueued on the owner's stream so far; the
// stream may wait for it on the device (nobody blocks) or the host may. Marks are numbered by the
// caller (0, 1, ...: one per bucket) and may be recorded again once nothing waits for them; one
// thread may record marks while another waits for earlier ones (the training thread and the
// communication thread).
// (llm.c's multi_gpu_async_reduce_gradient, flashlight's coalescing reducer, DDP's NCCL stream.)
class DeviceStream : public DeviceMemory {
 public:
  virtual void record(int mark) = 0;        // on the owner's stream
  virtual void wait(int mark) = 0;          // this stream waits for the mark (the host does not)
  virtual void host_wait(int mark) = 0;     // the host waits for the mark
  // The owner's stream waits (on the device) for everything enqueued on this stream so far.
  virtual void join_owner() = 0;
  // Makes this stream's device the calling thread's (CUDA's current device is per thread): for a
  // thread of its own that calls through this stream.
  virtual void attach_thread() {}
};

// A DeviceStream for a memory whose calls finish when they return (host memory standing in for a
// device, tests/device_like_backend.h): its calls are the owner's, its marks need no waiting.
std::unique_ptr<DeviceStream> make_synchronous_stream(DeviceMemory& owner);

// Host memory as a device (the CPU backend's memory; also what tools without a compute backend,
// such as the checkpoint fuzzer, allocate parameter stores in). models/cpu/host_memory.cpp.
DeviceMemory& host_memory();

// Copies of n floats between host and device memory that wait for the copy: for the rare places
// that read or write device state on the host (checkpoints, optimizer state, tests).
void copy_to_host(DeviceMemory& memory, const float* device, int64_t n, float* host);
void copy_to_device(DeviceMemory& memory, const float* host, int64_t n, float* device);

}  // namespace trainer::models
