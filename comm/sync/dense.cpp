#include "comm/sync/dense.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod dense_method() {
  SyncMethod m;
  m.name = "dense";
  m.doc = "bucketed allreduce of the averaged gradient";
  m.can.device_buffers = true;
  m.can.wrapped_in_warmup = false;  // every step is dense already
  m.can.capturable = true;          // on the GPU: the same bucket allreduces and one scale every step
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<DenseSync>(c.comm, c.n, o.bucket_mb, c.backend, o.wire_dtype,
                                       DenseBuckets{o.first_bucket_mb, o.overlap, c.views});
  };
  return m;
}

void allreduce_average(Communicator& comm, models::Backend& backend, float* data, int64_t n, int64_t bucket_elements,
                       const char* tag, WireDType wire) {
  const float scale = 1.f / static_cast<float>(comm.size());
  // fp16 divides by P in its cast (to stay in range); fp32 and bf16 after the sum (wire_format.h).
  const float pre_scale = wire_pre_scale(wire, comm.size());
  // A 16-bit wire's copy of one bucket: each bucket's allreduce completes before the next is cast,
  // so one buffer serves them all; it stays allocated for the next step (one per thread, and only
  // the thread that owns MPI communicates). fp32 buckets go out of `data` itself.
  thread_local std::vector<uint16_t> wire_bucket;
  for (int64_t begin = 0; begin < n; begin += bucket_elements) {
    const int64_t count = std::min(bucket_elements, n - begin);
    allreduce_sum_through_wire(comm, data + begin, count, wire, pre_scale, wire_bucket, tag);
  }
  // One scaling pass after all buckets: the buckets of a step are in flight back to back. On the
  // backend, where the data is (on the CPU the same element-wise product as a loop here).
  if (pre_scale == 1.f) backend.scale(n, scale, data);
}

int64_t bucket_elements(double bucket_mb) {
  return std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / 4));
}

DenseSync::DenseSync(Communicator& comm, int64_t n, double bucket_mb, models::Backend& backend, WireDType wire,
                     const DenseBuckets& buckets)
    : comm_(comm),
      n_(n),
      backend_(backend),
      wire_(wire),
      requested_overlap_(buckets.overlap && backend.is_host()),
      overlap_(requested_overlap_ && comm.size() > 1),
      pre_scale_(wire_pre_scale(wire, comm.size())),
      reducer_(comm,
               plan_gradient_buckets(n, buckets.views, bucket_elements(bucket_mb),
                                     bucket_elements(buckets.first_bucket_mb)),
               [this](size_t bucket, float* grads) {
                 const GradientBucket& b = reducer_.plan()[bucket];
                 allreduce_sum_through_wire(comm_, grads + b.begin, b.size(), wire_, pre_scale_, wire_bucket_,
                                            "ALLREDUCE_DENSE");
               },
               buckets.views) {
  if (wire != WireDType::kF32 && !backend.is_host())
    throw std::invalid_argument("sync.wire_dtype = \"" + wire_dtype_name(wire) + "\" casts on the host and cannot run " +
                                "with runtime.device = \"" + backend.name() + "\" yet (fp32 can)");
}

std::string DenseSync::describe() const {
  const size_t buckets = reducer_.plan().size();
  const int p = comm_.size();
  const int64_t bytes = wire_bytes(wire_);
  std::ostringstream out;
  out << "dense: " << buckets << " allreduce(s) ALLREDUCE_DENSE per step over " << n_ << " floats, on the wire as "
      << wire_dtype_name(wire_) << " (" << bytes << " bytes each: " << n_ * bytes / 1e6
      << " MB); ring traffic per rank 2(P-1)/P x " << bytes << "n = " << 2.0 * (p - 1) / p * n_ * bytes / 1e6
      << " MB at P = " << p << "; buckets in backward order, the first "
      << (buckets ? reducer_.plan()[0].size() * 4 / 1e6 : 0.0) << " MB"
      << (overlap_ || (comm_.size() == 1 && requested_overlap_) ? ", sent during backward (sync.overlap)"
                                                                 : ", sent after backward");
  return out.str();
}

std::string DenseSync::overlap_plan() const {
  if (!requested_overlap_) return "off (host buffers only; runtime.device = \"" + backend_.name() + "\")";
  return "dense buckets are sent during backward, each once its gradients are final";
}

bool DenseSync::begin_step(SyncBuffers& b, int64_t step) {
  if (!overlap_) return false;
  reducer_.begin(b.grads);
  early_step_ = step;
  return true;
}

void DenseSync::gradients_ready(int64_t from) {
  if (early_step_ >= 0) reducer_.ready(from);
}

int DenseSync::finish_early_sends() { return early_step_ >= 0 ? reducer_.finish() : -1; }

SyncStats DenseSync::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kDense);
  if (comm_.size() == 1) return {Phase::kDense, 1.0};
  if (early_step_ == step)
    reducer_.finish();  // a no-op when the trainer already waited (finish_early_sends)
  else
    reducer_.run_all(b.grads);
  early_step_ = -1;
  // One scaling pass after all buckets, as allreduce_average (fp16 was divided in its cast).
  if (pre_scale_ == 1.f) backend_.scale(n_, 1.f / static_cast<float>(comm_.size()), b.grads);
  return {Phase::kDense, 1.0};
}

void DenseSync::save(std::ostream& out) const { write_sync_header(out, "dense", 1); }
void DenseSync::load(std::istream& in) { read_sync_header(in, "dense", 1); }

}  // namespace trainer::comm
