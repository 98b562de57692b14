// The cuDNN ops of the CUDA backend: convolution (cudnn_conv.cpp), pooling (cudnn_pool.cpp) and
// the LSTM (cudnn_lstm.cpp).
// Batch norm is our own kernel (batch_norm.cu says why).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>

#include "models/backend.h"

namespace trainer::models::cuda {

// What the cuDNN ops share: the library handle, bound to the backend's stream, the backend's
// settings (precision, determinism), and one workspace that grows to the largest any op's chosen
// algorithm asked for. Ops run one at a time, in order,
// on that stream, so one workspace serves them all (as the CPU backend's one scratchpad does);
// growing happens while ops are made, never in a steady-state step.
class CudnnContext {
 public:
  CudnnContext(DeviceMemory& memory, cudaStream_t stream, const BackendSettings& settings);
  ~CudnnContext();
  CudnnContext(const CudnnContext&) = delete;
  CudnnContext& operator=(const CudnnContext&) = delete;

  cudnnHandle_t handle() const { return handle_; }
  DeviceMemory& memory() const { return memory_; }
  cudaStream_t stream() const { return stream_; }
  const BackendSettings& settings() const { return settings_; }
  bool bf16() const { return settings_.precision == Precision::kBf16; }
  bool tf32() const { return settings_.precision == Precision::kTf32; }
  void reserve_workspace(size_t bytes);
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  DeviceMemory& memory_;
  cudaStream_t stream_;
  const BackendSettings settings_;
  cudnnHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

std::unique_ptr<ConvOp> make_cudnn_conv(const ConvGeometry& g, CudnnContext& context);
std::unique_ptr<PoolOp> make_cudnn_pool(const PoolGeometry& g, CudnnContext& context);
std::unique_ptr<LstmOp> make_cudnn_lstm(const LstmGeometry& g, CudnnContext& context);

}  // namespace trainer::models::cuda
