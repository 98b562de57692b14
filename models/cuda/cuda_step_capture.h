// The CUDA backend's StepCapture (models/step_capture.h): a stream capture of one training step,
// instantiated once and replayed with cudaGraphLaunch.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "models/device_memory.h"
#include "models/step_capture.h"

namespace trainer::models::cuda {

class CudaStepCapture final : public StepCapture {
 public:
  CudaStepCapture(DeviceMemory& memory, cudaStream_t stream);
  ~CudaStepCapture() override;

  void begin_capture() override;
  std::string end_capture() override;
  void launch() override;
  void reset() override;
  bool captured() const override { return exec_ != nullptr; }
  size_t nodes() const override { return nodes_; }

  StepControl* control() override { return control_; }
  StepInputs* pinned_inputs() override { return pinned_inputs_; }
  void wait() override;
  void wait_results(StepResult* results) override;
  void prepare(int64_t updates_applied, int64_t gradient_elements) override;

  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* p) override;

  void set_deferred_loss(bool on) override { deferred_loss_ = on; }
  bool deferred_loss() const { return deferred_loss_; }

  void begin_step() override;
  void poison_if_nonfinite(float* grad_element) override;
  void check_and_clip(int64_t n, float* grads, double max_norm) override;
  void copy_if_skipped(int64_t n, const float* src, float* dst) override;
  void end_step() override;

 private:
  DeviceMemory& memory_;
  cudaStream_t stream_;
  StepControl* control_ = nullptr;
  StepInputs* pinned_inputs_ = nullptr;
  double* partials_ = nullptr;  // sum_of_squares' per-block partials, sized by prepare()
  int64_t partial_count_ = 0;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  cudaEvent_t done_ = nullptr;  // recorded after each launch
  bool deferred_loss_ = false;
};

}  // namespace trainer::models::cuda
