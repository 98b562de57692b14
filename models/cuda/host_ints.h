// A short host array of ints (a batch's sequence lengths, beam rows' utterances) handed to a kernel
// by value, as a kernel parameter. CUDA 12.1 and later allow 32,764 bytes of parameters on Volta and
// newer GPUs, so a batch's lengths fit: no device copy to upload, nothing to synchronize, and the
// caller may change its array as soon as the launch returns. This is why the backend seam keeps
// lengths as host arrays (models/backend.h) while the kernels read them on the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace trainer::models::cuda {

struct HostInts {
  static constexpr int64_t kCapacity = 1024;  // 4 KiB: any per-process batch (or beams x batch)
  int32_t count = 0;
  int32_t v[kCapacity];
};

// `n` values from `host` (null: every value `fill`).
inline HostInts host_ints(const int32_t* host, int64_t n, const char* what, int32_t fill = 0) {
  if (n < 0 || n > HostInts::kCapacity)
    throw std::invalid_argument(std::string("CUDA backend: ") + what + ": " + std::to_string(n) +
                                " sequences in one batch; at most " + std::to_string(HostInts::kCapacity) +
                                " per process are supported");
  HostInts ints;
  ints.count = static_cast<int32_t>(n);
  if (host)
    std::memcpy(ints.v, host, sizeof(int32_t) * n);
  else
    for (int64_t i = 0; i < n; ++i) ints.v[i] = fill;
  return ints;
}

}  // namespace trainer::models::cuda
