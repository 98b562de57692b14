// Host memory that the host cannot touch: a stand-in for device memory that faults (SIGSEGV) when
// host code reads or writes it outside the owner's own calls, as a GPU's memory cannot be read by
// host code at all. Without it, a device-like test (device_like_backend.h) passes even when product
// code forgets a copy and reads a device buffer directly, since the "device" buffer is host memory.
//
// Every allocation lies in one reserved range of address space, kept PROT_NONE; Open (a scope)
// makes the range's used part readable and writable while the owner's ops and copies run, nested
// and from any thread (the range is closed when the last one ends). Host code running on another
// thread during such a call is not caught: a guard over one process's pages cannot tell threads
// apart. Addresses are never reused (a freed allocation's pages are returned to the system and stay
// reserved), so a use after free faults too, outside calls.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "models/device_memory.h"

namespace trainer::testing {

class GuardedMemory final : public models::DeviceMemory {
 public:
  // 1 TiB of address space, no memory: the pages are committed only when written.
  static constexpr size_t kReserved = size_t(1) << 40;

  GuardedMemory() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    void* base = mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("GuardedMemory: cannot reserve address space");
    base_ = static_cast<char*>(base);
  }
  ~GuardedMemory() override { munmap(base_, kReserved); }
  GuardedMemory(const GuardedMemory&) = delete;
  GuardedMemory& operator=(const GuardedMemory&) = delete;

  // The owner's call in progress: the memory is the host's until the scope ends.
  class Open {
   public:
    explicit Open(GuardedMemory& memory) : memory_(memory) { memory_.open(); }
    ~Open() { memory_.close(); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedMemory& memory_;
  };

  std::string name() const override { return "guarded"; }
  // Whole pages, so that no two allocations share one and every byte outside a call faults.
  void* allocate(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + page_ - 1) / page_ * page_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (used_ + rounded > kReserved) throw std::bad_alloc();
    char* p = base_ + used_;
    used_ += rounded;
    if (opened_ > 0) protect(p, rounded, PROT_READ | PROT_WRITE);
    sizes_[p] = rounded;
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) throw std::invalid_argument("GuardedMemory::free: not an allocation of this memory");
    madvise(p, it->second, MADV_DONTNEED);  // its memory back to the system; the addresses stay reserved
    sizes_.erase(it);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    Open open(*this);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    Open open(*this);
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill(int64_t n, float value, float* y) override {
    Open open(*this);
    for (int64_t i = 0; i < n; ++i) y[i] = value;
  }
  void synchronize() override {}

  // Whether p lies in this memory's range (an allocation's or a freed one's).
  bool contains(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kReserved;
  }

  // What Open does, for a caller whose call's end is not a scope of its own (device_like_backend.h).
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (opened_++ == 0 && used_) protect(base_, used_, PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--opened_ == 0 && used_) protect(base_, used_, PROT_NONE);
  }

 private:
  static void protect(void* p, size_t bytes, int access) {
    if (mprotect(p, bytes, access) != 0) throw std::runtime_error("GuardedMemory: mprotect failed");
  }

  const size_t page_;
  char* base_ = nullptr;
  std::mutex mutex_;
  size_t used_ = 0;  // bytes of the range handed out so far, freed ones included
  int opened_ = 0;   // calls in progress
  std::map<void*, size_t> sizes_;
};

}  // namespace trainer::testing
