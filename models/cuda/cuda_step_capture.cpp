#include "models/cuda/cuda_step_capture.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "models/cuda/cuda_check.h"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {

CudaStepCapture::CudaStepCapture(DeviceMemory& memory, cudaStream_t stream) : memory_(memory), stream_(stream) {
  control_ = static_cast<StepControl*>(memory_.allocate(sizeof(StepControl)));
  check(cudaMallocHost(&pinned_inputs_, sizeof(StepInputs)), "cudaMallocHost (step inputs)");
  *pinned_inputs_ = StepInputs{};
  check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
}

CudaStepCapture::~CudaStepCapture() {
  reset();
  if (partials_) memory_.free(partials_);
  memory_.free(control_);
  cudaFreeHost(pinned_inputs_);
  cudaEventDestroy(done_);
}

// Thread-local: the loader's threads may call the runtime meanwhile, but any call of this thread
// that would wait or allocate fails the capture instead of running.
void CudaStepCapture::begin_capture() {
  reset();
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

std::string CudaStepCapture::end_capture() {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess || !graph) {
    cudaGetLastError();  // a capture broken by a forbidden call reports it here; not sticky
    if (graph) cudaGraphDestroy(graph);
    return std::string("the capture failed: ") + cudaGetErrorString(ended);
  }
  cudaGraphGetNodes(graph, nullptr, &nodes_);
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    exec_ = nullptr;
    return std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
  }
  return "";
}

void CudaStepCapture::launch() {
  if (!exec_) throw std::logic_error("CudaStepCapture::launch without a captured step");
  check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  check(cudaEventRecord(done_, stream_), "cudaEventRecord");
}

void CudaStepCapture::reset() {
  if (exec_) {
    cudaStreamSynchronize(stream_);  // a launch in flight still uses it
    cudaGraphExecDestroy(exec_);
  }
  exec_ = nullptr;
  nodes_ = 0;
}

void CudaStepCapture::wait() { check(cudaEventSynchronize(done_), "cudaEventSynchronize"); }

void CudaStepCapture::wait_results(StepResult* results) {
  wait();
  check(cudaMemcpyAsync(results, control_->results, sizeof(control_->results), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (step results)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaStepCapture::prepare(int64_t updates_applied, int64_t gradient_elements) {
  StepControl initial;
  initial.updates_applied = updates_applied;
  // Pageable source: the driver stages it before the call returns; the stream orders it first.
  check(cudaMemcpyAsync(control_, &initial, sizeof initial, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  const int64_t partials = sum_of_squares_partials(gradient_elements);
  if (partials > partial_count_) {
    if (partials_) memory_.free(partials_);
    partials_ = static_cast<double*>(memory_.allocate(sizeof(double) * partials));
    partial_count_ = partials;
  }
}

void* CudaStepCapture::allocate_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost");
  return p;
}

void CudaStepCapture::free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

void CudaStepCapture::begin_step() {
  check(cudaMemcpyAsync(&control_->in, pinned_inputs_, sizeof(StepInputs), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (step inputs)");
  check(launch_begin_step(control_, stream_), "begin_step");
}

void CudaStepCapture::poison_if_nonfinite(float* grad_element) {
  check(launch_poison_if_nonfinite(control_, grad_element, stream_), "poison_if_nonfinite");
}

void CudaStepCapture::check_and_clip(int64_t n, float* grads, double max_norm) {
  if (sum_of_squares_partials(n) > partial_count_) throw std::logic_error("check_and_clip: prepare() for a smaller gradient");
  check(launch_sum_of_squares(n, grads, partials_, &control_->norm_sq, stream_), "check_and_clip: sum of squares");
  check(launch_clip_decide(control_, max_norm, stream_), "check_and_clip: decide");
  if (max_norm > 0) check(launch_scale_by_control(n, control_, grads, stream_), "check_and_clip: scale");
}

void CudaStepCapture::copy_if_skipped(int64_t n, const float* src, float* dst) {
  check(launch_copy_if_skipped(n, control_, src, dst, stream_), "copy_if_skipped");
}

void CudaStepCapture::end_step() { check(launch_end_step(control_, stream_), "end_step"); }

}  // namespace trainer::models::cuda
