#include "models/device_memory.h"

namespace trainer::models {

void copy_to_host(DeviceMemory& memory, const float* device, int64_t n, float* host) {
  if (n <= 0) return;
  memory.copy_to_host(host, device, static_cast<size_t>(n) * sizeof(float));
  memory.synchronize();
}

void copy_to_device(DeviceMemory& memory, const float* host, int64_t n, float* device) {
  if (n <= 0) return;
  memory.copy_to_device(device, host, static_cast<size_t>(n) * sizeof(float));
  memory.synchronize();
}

}  // namespace trainer::models
