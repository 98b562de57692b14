#include "models/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <new>
#include <stdexcept>

#include "models/cuda/fill.h"

namespace trainer::models::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

class CudaDevice final : public DeviceMemory {
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
  cudaStream_t stream() const { return stream_; }

 private:
  int ordinal_ = 0, count_ = 0;
  cudaDeviceProp properties_{};
  cudaStream_t stream_ = nullptr;
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
