// The memory half of the CUDA backend: one GPU per process, its memory, one stream, copies and fill.
// The compute ops (cuDNN, cuBLAS, our kernels) are not written yet, so this is a DeviceMemory and
// not yet a Backend: runtime.device = "cuda" stops with one line after selecting the GPU
// (trainer/experiment.cpp). Compiled only with cmake -DTRAINER_CUDA=ON.
#pragma once

#include <string>

#include "models/device_memory.h"

namespace trainer::models::cuda {

// The process's GPU: number local_rank % visible GPUs (several ranks may share one), made current
// on first use; later calls return the same device whatever their argument. Throws
// std::runtime_error with one line ("no usable GPU: ...") when no GPU can be used.
DeviceMemory& cuda_device(int local_rank);

// "cuda: GPU 0 of 1, <name>, <memory> GiB" for --dry-run and messages.
std::string describe_cuda_device(int local_rank);

}  // namespace trainer::models::cuda
