#include "comm/sync/methods/dense/dense.h"

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
    return std::make_unique<DenseSync>(c.comm, c.n, o.bucket_mb, c.backend, o.wire(),
                                       DenseBuckets{o.first_bucket_mb, o.overlap, c.views});
  };
  return m;
}

void allreduce_average(Communicator& comm, models::Backend& backend, float* data, int64_t n, int64_t bucket_elements,
                       const char* tag, WireDType wire) {
  if (wire != WireDType::kF32 && !backend.is_host())
    throw std::logic_error("allreduce_average: a 16-bit wire casts on the host, and the buffers are " +
                           backend.name() + " memory");
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
      requested_overlap_(buckets.overlap),
      overlap_(requested_overlap_ && comm.size() > 1),
      pre_scale_(wire_pre_scale(wire, comm.size())),
      bucket_comm_(&comm),
      reducer_(comm,
               plan_gradient_buckets(n, buckets.views, bucket_elements(bucket_mb),
                                     bucket_elements(buckets.first_bucket_mb)),
               [this](size_t bucket, float* grads) { bucket_job(bucket, grads); }, buckets.views) {
  if (backend.is_host()) return;
  if (wire != WireDType::kF32) half_ = models::DeviceBuffer(backend, (n + 1) / 2);
  if (!overlap_) return;
  // Overlap on a device: a second stream and this communicator's calls on it.
  stream_ = backend.make_stream();
  if (stream_) stream_comm_ = comm.on_stream(*stream_);
  if (!stream_)
    no_overlap_ = "runtime.device = \"" + backend.name() + "\" has no second stream";
  else if (!stream_comm_)
    no_overlap_ = "the communicator cannot run on a second stream";
  if (!no_overlap_.empty()) {
    overlap_ = false;
    return;
  }
  OnDevice device;
  device.backend = &backend;
  device.stream = stream_.get();
  device.enqueues = stream_comm_->enqueues();
  if (wire != WireDType::kF32)
    device.stage = [this](size_t bucket, float* grads) {
      const GradientBucket& b = reducer_.plan()[bucket];
      backend_.to_half(half_format(wire_), b.size(), grads + b.begin, pre_scale_, half() + b.begin);
    };
  reducer_.run_on_device(std::move(device));
}

// One bucket's allreduce-sum: host buffers through the wire's host loops; device buffers in place
// (fp32, whose pre-scale is 1) or through the 16-bit copy, cast here unless the bucket was staged
// (overlap: cast on the compute stream as it was handed over, widened once in finish_overlap).
void DenseSync::bucket_job(size_t bucket, float* grads) {
  const GradientBucket& b = reducer_.plan()[bucket];
  if (backend_.is_host()) {
    allreduce_sum_through_wire(comm_, grads + b.begin, b.size(), wire_, pre_scale_, wire_bucket_, "ALLREDUCE_DENSE");
    return;
  }
  Communicator& c = *bucket_comm_;
  if (wire_ == WireDType::kF32) {
    c.allreduce(grads + b.begin, b.size(), DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
    return;
  }
  const bool staged = bucket_comm_ != &comm_;
  uint16_t* h = half() + b.begin;
  if (!staged) backend_.to_half(half_format(wire_), b.size(), grads + b.begin, pre_scale_, h);
  c.allreduce(h, b.size(), wire_comm_dtype(wire_), ReduceOp::kSum, "ALLREDUCE_DENSE");
  if (!staged) backend_.from_half(half_format(wire_), b.size(), h, grads + b.begin);
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
  if (!requested_overlap_) return "off (sync.overlap = false)";
  if (!no_overlap_.empty()) return "off (" + no_overlap_ + ")";
  if (!reducer_.on_device()) return "dense buckets are sent during backward, each once its gradients are final";
  return "dense buckets are sent during backward on a second stream of the device, each once its gradients are "
         "final (" + std::string(stream_comm_->enqueues() ? "enqueued as backward hands them over" :
                                                            "staged through the host by a communication thread") +
         "; a recorded CUDA graph sends them after backward)";
}

bool DenseSync::begin_step(SyncBuffers& b, int64_t step) {
  if (!overlap_) return false;
  if (stream_comm_) bucket_comm_ = stream_comm_.get();
  reducer_.begin(b.grads);
  b_grads_ = b.grads;
  early_step_ = step;
  early_finished_ = false;
  return true;
}

void DenseSync::gradients_ready(int64_t from) {
  // Not after the step's finish (a step skipped as non-finite leaves early_step_ set; a recorded
  // CUDA graph's backward then reports its gradients without a begin_step).
  if (early_step_ >= 0 && !early_finished_) reducer_.ready(from);
}

void DenseSync::finish_overlap() {
  if (early_finished_) return;
  early_finished_ = true;
  nonfinite_tensor_ = reducer_.finish();
  if (!stream_comm_) return;
  // The compute stream now waits for the buckets' stream (the reducer's finish): widen there.
  if (wire_ != WireDType::kF32) backend_.from_half(half_format(wire_), n_, half(), b_grads_);
  stream_comm_->complete_records();  // NCCL's timed calls (waits for them only while the log times)
  bucket_comm_ = &comm_;
}

int DenseSync::finish_early_sends() {
  if (early_step_ < 0) return -1;
  finish_overlap();
  return nonfinite_tensor_;
}

SyncStats DenseSync::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kDense);
  if (comm_.size() == 1) return {Phase::kDense, 1.0};
  if (early_step_ == step)
    finish_overlap();  // a no-op when the trainer already waited (finish_early_sends)
  else
    reducer_.run_all(b.grads);  // on the compute stream (bucket_comm_ is comm_ outside an overlapped step)
  early_step_ = -1;
  // One scaling pass after all buckets, as allreduce_average (fp16 was divided in its cast).
  if (pre_scale_ == 1.f) backend_.scale(n_, 1.f / static_cast<float>(comm_.size()), b.grads);
  return {Phase::kDense, 1.0};
}

void DenseSync::save(std::ostream& out) const { write_sync_header(out, "dense", 1); }
void DenseSync::load(std::istream& in) { read_sync_header(in, "dense", 1); }

WireVolume DenseSync::wire_volume() const {
  const double p = comm_.size();
  // In 4-byte words: a 16-bit wire sends half as many.
  const double words = 2.0 * (p - 1) / p * static_cast<double>(n_) * (wire_ == WireDType::kF32 ? 1.0 : 0.5);
  return {words, wire_ == WireDType::kF32 ? "2n(P-1)/P (ring)" : "2n(P-1)/P x 1/2 (ring, 16-bit)"};
}

}  // namespace trainer::comm
