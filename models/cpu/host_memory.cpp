// Host memory as a DeviceMemory: 64-byte aligned allocations, copies that are done when they
// return. No oneDNN or BLAS here, so the fuzz build can link it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "models/device_memory.h"

namespace trainer::models {
namespace {

class HostMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (!p) throw std::bad_alloc();
    return p;
  }
  void free(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void fill(int64_t n, float value, float* y) override {
    if (n <= 0) return;
    if (value == 0.f) {
      std::memset(y, 0, sizeof(float) * n);  // what the stores did before the device seam
      return;
    }
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) y[i] = value;
  }
  void synchronize() override {}
};

}  // namespace

DeviceMemory& host_memory() {
  static HostMemory memory;
  return memory;
}

}  // namespace trainer::models
