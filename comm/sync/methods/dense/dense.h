#pragma once

#include <memory>

#include "comm/sync/methods/dense/bucket_reducer.h"
#include "comm/sync/gradient_sync.h"
#include "comm/wire_format.h"
#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// How the dense gradient is cut and when its buckets go out (gradient_buckets.h, bucket_reducer.h).
struct DenseBuckets {
  double first_bucket_mb = 1.0;
  bool overlap = false;  // during backward (bucket_reducer.h; on a device on a second stream)
  const std::vector<models::ParamView>* views = nullptr;  // whole tensors per bucket; null: plain pieces
};

// Dense data parallelism (synchronous SGD): the flat gradient is allreduced in buckets of
// bucket_mb megabytes (as PyTorch DDP does, so no single message is the whole model), cut in the
// order backward produces them and, with overlap, sent while backward runs; then divided by the
// world size. Every step sends 2(P-1)/P x 4n bytes per rank with a ring allreduce. No state.
// The buffers may be device buffers: `comm` then moves device memory (comm/device_communicator.h)
// and the division runs on `backend`, the one the buffers live in.
// With a 16-bit `wire` (comm/wire_format.h) each bucket is cast into bf16 or fp16 on its way to
// the allreduce and back, so 2(P-1)/P x 2n bytes go out; bucket_mb still counts the fp32 gradient
// (as DDP's bucket_cap_mb does under its compression hooks). Host buffers are cast by
// allreduce_sum_through_wire's loops; device buffers by the backend's to_half / from_half (the same
// bits) into a 16-bit copy of the gradient on the device, which the communicator reduces as it is
// (NCCL natively; host staging with the MPI reduction of wire_format.h).
//
// Overlap on a device (sync.overlap): the buckets' collectives run on a second stream of the
// device (DeviceMemory::make_stream) through `comm.on_stream`, ordered after backward's kernels by
// one event per bucket (bucket_reducer.h, OnDevice): with NCCL enqueued from gradients_ready itself,
// with host staging by the communication thread. A 16-bit bucket is cast on the compute stream as
// it is handed over and the whole gradient widened once after the last bucket (finish). A recorded
// CUDA graph (trainer/step/step_graph.h) records the step without overlap: reduce() after backward, on
// the compute stream (capturable as it always was).
class DenseSync final : public GradientSync {
 public:
  // A ring allreduce's: each rank sends 2 (P-1)/P of the gradient in the wire's format.
  WireVolume wire_volume() const override;
  DenseSync(Communicator& comm, int64_t n, double bucket_mb, models::Backend& backend,
            WireDType wire = WireDType::kF32, const DenseBuckets& buckets = {});
  std::string name() const override { return "dense"; }
  std::string describe() const override;
  Phase phase(int64_t) const override { return Phase::kDense; }
  bool begin_step(SyncBuffers& b, int64_t step) override;
  void gradients_ready(int64_t from) override;
  int finish_early_sends() override;
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  std::string overlap_plan() const override;
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override { return load_replicated(states); }
  const std::vector<GradientBucket>& buckets() const { return reducer_.plan(); }

 private:
  Communicator& comm_;
  int64_t n_;
  models::Backend& backend_;
  WireDType wire_;
  bool requested_overlap_;  // sync.overlap (a one-process run has nothing to send)
  std::string no_overlap_;  // why a device cannot overlap ("" when it can, or on the host)
  bool overlap_;
  float pre_scale_;                 // wire_pre_scale: fp16 divides by P in its cast
  std::vector<uint16_t> wire_bucket_;  // a 16-bit wire's copy of one bucket (host buffers: one at a time)
  // Device buffers: the 16-bit copy of the whole gradient (a 16-bit wire), and for overlap the
  // second stream and the communicator on it. Declared before the reducer, whose thread uses them.
  models::DeviceBuffer half_;
  std::unique_ptr<models::DeviceStream> stream_;
  std::unique_ptr<Communicator> stream_comm_;
  Communicator* bucket_comm_;  // the communicator of this step's buckets
  BucketReducer reducer_;
  int64_t early_step_ = -1;  // the step whose buckets went out during backward
  bool early_finished_ = false;
  float* b_grads_ = nullptr;  // the overlapped step's gradient

  uint16_t* half() { return reinterpret_cast<uint16_t*>(half_.data()); }
  void bucket_job(size_t bucket, float* grads);
  void finish_overlap();  // once per overlapped step: the reducer's finish, then the widening
  int nonfinite_tensor_ = -1;
};

// Floats per bucket of `bucket_mb` megabytes (at least one): dense sync, parameter averaging and the
// run description (run.json) share this one rounding.
int64_t bucket_elements(double bucket_mb);

// Allreduce-average of a flat float buffer of `backend` (device memory: `comm` must move it) in
// buckets, tagged `tag`: what dense gradient sync and parameter averaging (local SGD) both do.
// `wire`: the format the buckets travel in (gradients only: parameters and BN statistics are
// averaged in fp32, never rounded); a 16-bit one needs host memory (std::logic_error otherwise:
// dense sync, which casts device buckets, is the only 16-bit user with device buffers).
void allreduce_average(Communicator& comm, models::Backend& backend, float* data, int64_t n, int64_t bucket_elements,
                       const char* tag, WireDType wire = WireDType::kF32);

}  // namespace trainer::comm
