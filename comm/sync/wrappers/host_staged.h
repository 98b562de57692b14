// A method that computes on host buffers, run where the model's buffers live on a device
// (runtime.device = "cuda"): each call copies what the method reads to host mirrors, runs the
// method there (its arithmetic on the CPU backend, its messages over MPI), and copies what it wrote
// back. Every built-in method's spec says device_buffers (registry.h) and runs on the device
// itself; what comes here is a compressor whose options are host loops (its spec's
// needs_host_buffers: sync.<method>.keep_dense, sync.<method>.adaptive, a 16-bit sync.wire_dtype) and a method
// registered without device buffers (an extension's first version).
//
// Why whole buffers, not only a compressed payload: this is the path that lets such a method train
// on a GPU, with its CPU code (its tests, its checkpoint format) unchanged. Its cost
// is two copies of the gradient per step (and of the parameters for the methods that sync them),
// at PCIe or NVLink-C2C rates: for the Ok-Top-k paper's LSTM (110 MB of gradient) a few ms a way
// against its 2.8 s dense step on the paper's A100s; the selection itself then runs on the host's
// cores. A method moves onto device buffers by implementing its arithmetic as backend ops and
// saying device_buffers in its spec, and then stops coming here.
//
// What crosses: the gradient, always; the parameters and the non-trainable state (BN statistics)
// too for a method that syncs parameters (keeps_parameters_equal is false in its spec), in reduce()
// and after_step(). Overlap with backward is off (the gradient is whole only once backward is
// done). The state the method saves is its own, on the
// host: checkpoints are the same files as on the CPU, so a run resumes on either device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/sync/gradient_sync.h"
#include "models/device_memory.h"

namespace trainer::comm {

class HostStagedSync final : public GradientSync {
 public:
  // `method` was built for host buffers (the CPU backend, a communicator of host memory);
  // `device`: where the SyncBuffers passed to this one live. `moves_parameters`: see above.
  HostStagedSync(std::unique_ptr<GradientSync> method, models::DeviceMemory& device, bool moves_parameters);
  std::string name() const override { return method_->name(); }
  std::string describe() const override;
  Phase phase(int64_t step) const override { return method_->phase(step); }
  WireVolume wire_volume() const override { return method_->wire_volume(); }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  void after_step(SyncBuffers& b, int64_t step) override;
  void complete_in_flight() override { method_->complete_in_flight(); }
  std::string overlap_plan() const override;
  void save(std::ostream& out) const override { method_->save(out); }
  void load(std::istream& in) override { method_->load(in); }
  std::string load_resharded(const std::vector<std::string>& states) override {
    return method_->load_resharded(states);
  }

  // Bytes copied each way so far (tests, the description's figures).
  int64_t bytes_to_host() const { return bytes_to_host_; }
  int64_t bytes_to_device() const { return bytes_to_device_; }

 private:
  // Host mirrors of `b`'s buffers: the gradient, and with `parameters` the parameters and state.
  SyncBuffers& to_host(const SyncBuffers& b, bool gradient, bool parameters);
  void to_device(SyncBuffers& b, bool gradient, bool parameters);

  std::unique_ptr<GradientSync> method_;
  models::DeviceMemory& device_;
  bool moves_parameters_;
  std::vector<float> params_, grads_, state_;
  SyncBuffers host_;
  int64_t bytes_to_host_ = 0, bytes_to_device_ = 0;
};

}  // namespace trainer::comm
