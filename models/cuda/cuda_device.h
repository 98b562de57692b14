// The memory half of the CUDA backend: one GPU per process, its memory, one stream, copies and fill.
// The compute ops (cuDNN, cuBLAS, our kernels) are the Backend of cuda_backend.h, built on this
// device and its stream. Compiled only with cmake -DTRAINER_CUDA=ON.
#pragma once

#include <string>

#include "models/device_memory.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header stays free of CUDA's headers

namespace trainer::models::cuda {

// The process's GPU: number local_rank % visible GPUs (several ranks may share one), made current
// on first use; later calls return the same device whatever their argument. Throws
// std::runtime_error with one line ("no usable GPU: ...") when no GPU can be used.
DeviceMemory& cuda_device(int local_rank);

// The stream every copy and op on the process's GPU is enqueued on (same selection rule).
CUstream_st* cuda_stream(int local_rank);

// "cuda: GPU 0 of 1, <name>, <memory> GiB" for --dry-run and messages.
std::string describe_cuda_device(int local_rank);

}  // namespace trainer::models::cuda
