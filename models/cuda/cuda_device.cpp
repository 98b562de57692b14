#include "models/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "models/cuda/fill.h"

namespace trainer::models::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// DeviceMemory's calls that run on a stream (`stream_`): the device's own, or a second one.
template <class Memory>
class OnStream : public Memory {
 public:
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync to device");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync to host");
  }
  void fill(int64_t n, float value, float* y) override {
    if (n > 0) check(launch_fill(n, value, y, stream_), "fill kernel");
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void* stream_handle() override { return stream_; }

 protected:
  cudaStream_t stream_ = nullptr;
};

// A second stream on the device (DeviceMemory::make_stream): copies and fills of its own, marks as
// CUDA events recorded on the owner's stream. Events without timing, so that recording and waiting
// cost nothing extra (the NCCL communicator times its calls with events of its own).
class CudaStream final : public OnStream<DeviceStream> {
 public:
  CudaStream(DeviceMemory& owner, cudaStream_t owner_stream) : owner_(owner), owner_stream_(owner_stream) {
    check(cudaGetDevice(&ordinal_), "cudaGetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (second stream)");
    check(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaStream() override {
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    cudaEventDestroy(joined_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return owner_.name(); }
  void* allocate(size_t bytes) override { return owner_.allocate(bytes); }
  void free(void* p) override { owner_.free(p); }

  void record(int mark) override { check(cudaEventRecord(event(mark), owner_stream_), "cudaEventRecord"); }
  void wait(int mark) override { check(cudaStreamWaitEvent(stream_, event(mark), 0), "cudaStreamWaitEvent"); }
  void host_wait(int mark) override { check(cudaEventSynchronize(event(mark)), "cudaEventSynchronize"); }
  void join_owner() override {
    check(cudaEventRecord(joined_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(owner_stream_, joined_, 0), "cudaStreamWaitEvent");
  }
  void attach_thread() override { check(cudaSetDevice(ordinal_), "cudaSetDevice (communication thread)"); }

 private:
  // Made on first use (one per bucket, so a step allocates none after the first). Under a lock: the
  // training thread records marks while the communication thread waits for earlier ones.
  cudaEvent_t event(int mark) {
    std::lock_guard<std::mutex> lock(marks_mutex_);
    while (static_cast<int>(marks_.size()) <= mark) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      marks_.push_back(e);
    }
    return marks_[static_cast<size_t>(mark)];
  }

  DeviceMemory& owner_;
  cudaStream_t owner_stream_;
  int ordinal_ = 0;
  cudaEvent_t joined_ = nullptr;
  std::mutex marks_mutex_;
  std::vector<cudaEvent_t> marks_;
};

class CudaDevice final : public OnStream<DeviceMemory> {
 public:
  explicit CudaDevice(int local_rank) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
      throw std::runtime_error(std::string("no usable GPU: ") +
                               (status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device visible"));
    ordinal_ = local_rank % count;
    count_ = count;
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    check(cudaGetDeviceProperties(&properties_, ordinal_), "cudaGetDeviceProperties");
    // Non-blocking: the stream does not wait for the legacy default stream, which libraries and
    // other code may use.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaDevice() override { cudaStreamDestroy(stream_); }

  std::string name() const override { return "cuda"; }

  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "cuda: GPU %d of %d, %s, %.1f GiB", ordinal_, count_, properties_.name,
                  properties_.totalGlobalMem / double(1ull << 30));
    return buf;
  }

  // cudaMalloc aligns to at least 256 bytes. Freeing synchronizes the device, so buffers are meant to
  // be made once and grown rarely (DeviceBuffer only grows); a caching pool comes with the compute ops.
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      throw std::bad_alloc();
    }
    return p;
  }
  void free(void* p) override { cudaFree(p); }
  std::unique_ptr<DeviceStream> make_stream() override { return std::make_unique<CudaStream>(*this, stream_); }
  cudaStream_t stream() const { return stream_; }

 private:
  int ordinal_ = 0, count_ = 0;
  cudaDeviceProp properties_{};
};

CudaDevice& device(int local_rank) {
  static std::unique_ptr<CudaDevice> the_device;
  if (!the_device) the_device = std::make_unique<CudaDevice>(local_rank);
  return *the_device;
}

}  // namespace

DeviceMemory& cuda_device(int local_rank) { return device(local_rank); }

CUstream_st* cuda_stream(int local_rank) { return device(local_rank).stream(); }

std::string describe_cuda_device(int local_rank) { return device(local_rank).describe(); }

}  // namespace trainer::models::cuda
