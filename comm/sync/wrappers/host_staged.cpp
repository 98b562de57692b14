#include "comm/sync/wrappers/host_staged.h"

#include <sstream>

namespace trainer::comm {

HostStagedSync::HostStagedSync(std::unique_ptr<GradientSync> method, models::DeviceMemory& device,
                               bool moves_parameters)
    : method_(std::move(method)), device_(device), moves_parameters_(moves_parameters) {}

std::string HostStagedSync::describe() const {
  std::ostringstream out;
  out << method_->describe() << "\nthrough host memory (runtime.device = \"" << device_.name()
      << "\"; the method computes on the host): the gradient"
      << (moves_parameters_ ? ", the parameters and the BN statistics" : "")
      << " copied to the host and back every step";
  return out.str();
}

std::string HostStagedSync::overlap_plan() const {
  return "none (" + method_->name() + " runs on host copies of the whole gradient, taken after backward)";
}

SyncBuffers& HostStagedSync::to_host(const SyncBuffers& b, bool gradient, bool parameters) {
  host_.n = b.n;
  host_.n_state = b.n_state;
  host_.views = b.views;
  auto copy = [&](const float* from, int64_t n, std::vector<float>& mirror, float*& into) {
    mirror.resize(static_cast<size_t>(n));
    into = mirror.data();
    if (!from || n == 0) return;
    models::copy_to_host(device_, from, n, mirror.data());
    bytes_to_host_ += n * static_cast<int64_t>(sizeof(float));
  };
  if (gradient) copy(b.grads, b.n, grads_, host_.grads);
  if (parameters) {
    copy(b.params, b.n, params_, host_.params);
    copy(b.state, b.n_state, state_, host_.state);
  }
  return host_;
}

void HostStagedSync::to_device(SyncBuffers& b, bool gradient, bool parameters) {
  auto copy = [&](const std::vector<float>& mirror, float* into) {
    if (!into || mirror.empty()) return;
    models::copy_to_device(device_, mirror.data(), static_cast<int64_t>(mirror.size()), into);
    bytes_to_device_ += static_cast<int64_t>(mirror.size() * sizeof(float));
  };
  if (gradient) copy(grads_, b.grads);
  if (parameters) {
    copy(params_, b.params);
    copy(state_, b.state);
  }
}

SyncStats HostStagedSync::reduce(SyncBuffers& b, int64_t step) {
  SyncStats stats = method_->reduce(to_host(b, true, moves_parameters_), step);
  to_device(b, true, moves_parameters_);
  return stats;
}

void HostStagedSync::after_step(SyncBuffers& b, int64_t step) {
  if (!moves_parameters_) {
    // A gradient method's after_step has nothing to do (the base's is empty); it is still called,
    // on the host mirrors, in case one ever does.
    method_->after_step(host_, step);
    return;
  }
  method_->after_step(to_host(b, false, true), step);
  to_device(b, false, true);
}

}  // namespace trainer::comm
