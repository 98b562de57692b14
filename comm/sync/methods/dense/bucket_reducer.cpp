#include "comm/sync/methods/dense/bucket_reducer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/comm_log.h"

namespace trainer::comm {

BucketReducer::BucketReducer(Communicator& comm, std::vector<GradientBucket> plan, BucketJob job,
                             const std::vector<models::ParamView>* views)
    : comm_(comm), plan_(std::move(plan)), job_(std::move(job)), views_(views), ready_us_(plan_.size(), -1) {}

BucketReducer::~BucketReducer() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

void BucketReducer::run_on_device(OnDevice device) {
  device_ = std::move(device);
  // One slot per tensor (each lies in one bucket: buckets are of whole tensors), or per bucket
  // when there are no views.
  slot_ranges_.clear();
  bucket_slots_.assign(plan_.size(), {});
  for (size_t b = 0; b < plan_.size(); ++b) {
    const GradientBucket& bucket = plan_[b];
    if (!views_) {
      bucket_slots_[b].push_back(static_cast<int>(slot_ranges_.size()));
      slot_ranges_.push_back({bucket.begin, bucket.end});
      continue;
    }
    for (size_t t = 0; t < views_->size(); ++t) {
      const models::ParamView& v = (*views_)[t];
      const int64_t lo = std::max(v.offset, bucket.begin), hi = std::min(v.offset + v.numel(), bucket.end);
      if (lo < hi) bucket_slots_[b].push_back(static_cast<int>(t));
    }
  }
  if (views_)
    for (const models::ParamView& v : *views_) slot_ranges_.push_back({v.offset, v.offset + v.numel()});
  // Doubles in a float buffer (2 floats each; allocations are 64-byte aligned).
  squares_ = models::DeviceBuffer(*device_.backend, 2 * static_cast<int64_t>(std::max<size_t>(1, slot_ranges_.size())));
  host_squares_.assign(slot_ranges_.size(), 0.0);
}

void BucketReducer::run_all(float* grads) {
  std::fill(ready_us_.begin(), ready_us_.end(), -1);
  for (size_t b = 0; b < plan_.size(); ++b) job_(b, grads);
}

void BucketReducer::begin(float* grads) {
  const bool threaded = !on_device() || !device_.enqueues;  // NCCL's calls need no thread
  if (threaded && !thread_.joinable()) thread_ = std::thread([this] { serve(); });
  std::lock_guard<std::mutex> lock(mutex_);
  grads_ = grads;
  handed_ = reduced_ = 0;
  nonfinite_tensor_ = -1;
}

void BucketReducer::ready(int64_t from) {
  size_t handed = 0, before = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t now = comm_.log().now_us();
    before = handed_;
    // On a device a bucket is staged before the thread may take it: count it handed only then.
    size_t final_buckets = handed_;
    while (final_buckets < plan_.size() && plan_[final_buckets].begin >= from) ready_us_[final_buckets++] = now;
    if (!on_device()) handed_ = final_buckets;
    handed = final_buckets;
  }
  if (!on_device()) {
    if (handed > before) work_.notify_one();
    return;
  }
  // The training thread enqueues each newly final bucket's squares, stage and mark on the compute
  // stream; NCCL's job is enqueued right behind on the communication stream, a staged one goes to
  // the thread.
  for (size_t b = before; b < handed; ++b) {
    stage_on_device(b);
    if (device_.enqueues) {
      device_.stream->wait(static_cast<int>(b));
      comm_.log().set_ready(ready_us_[b]);
      job_(b, grads_);
      ++reduced_;  // the training thread's own count: no thread reads it
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handed_ = handed;
  }
  if (!device_.enqueues && handed > before) work_.notify_one();
}

void BucketReducer::stage_on_device(size_t b) {
  for (int slot : bucket_slots_[b]) {
    const auto [lo, hi] = slot_ranges_[static_cast<size_t>(slot)];
    device_.backend->sum_of_squares_into(hi - lo, grads_ + lo, reinterpret_cast<double*>(squares_.data()) + slot);
  }
  if (device_.stage) device_.stage(b, grads_);
  device_.stream->record(static_cast<int>(b));
}

int BucketReducer::finish() {
  ready(0);
  if (!on_device() || !device_.enqueues) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return reduced_ == plan_.size() || error_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  return on_device() ? finish_on_device() : nonfinite_tensor_;
}

int BucketReducer::finish_on_device() {
  // The squares were enqueued on the compute stream before each mark: copy them out there, mark
  // that, and only then make the compute stream wait for the communication stream, so that the
  // host waits for backward's work and the squares but not for the collectives.
  const int copied = static_cast<int>(plan_.size());
  models::DeviceMemory& compute = *device_.backend;
  compute.copy_to_host(host_squares_.data(), squares_.data(), sizeof(double) * host_squares_.size());
  device_.stream->record(copied);
  device_.stream->join_owner();
  device_.stream->host_wait(copied);
  int first = -1;
  for (size_t slot = 0; slot < host_squares_.size(); ++slot)
    if (!std::isfinite(host_squares_[slot])) {
      first = views_ ? static_cast<int>(slot) : 0;  // without views, as first_nonfinite_tensor
      break;
    }
  return first;
}

void BucketReducer::serve() {
  omp_set_num_threads(1);  // this thread's own loops run on it alone
  if (on_device()) device_.stream->attach_thread();
  for (;;) {
    size_t b = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stop_ || reduced_ < handed_; });
      if (stop_) return;
      b = reduced_;
    }
    try {
      run_bucket(b);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      done_.notify_one();
      return;  // the training thread rethrows; the job ends
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++reduced_;
    }
    done_.notify_one();
  }
}

void BucketReducer::run_bucket(size_t b) {
  if (on_device()) {  // checked on the compute stream (stage_on_device); the copy waits for the mark
    device_.stream->wait(static_cast<int>(b));
    comm_.log().set_ready(ready_us_[b]);
    job_(b, grads_);
    return;
  }
  const GradientBucket& bucket = plan_[b];
  const float* g = grads_ + bucket.begin;
  double squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < bucket.size(); ++i) squares += static_cast<double>(g[i]) * g[i];
  if (!std::isfinite(squares)) {
    const int t = first_nonfinite_tensor(bucket);
    std::lock_guard<std::mutex> lock(mutex_);
    if (nonfinite_tensor_ < 0 || t < nonfinite_tensor_) nonfinite_tensor_ = t;
  }
  comm_.log().set_ready(ready_us_[b]);  // the job's first message carries it
  job_(b, grads_);
}

int BucketReducer::first_nonfinite_tensor(const GradientBucket& bucket) const {
  const int tensors = views_ ? static_cast<int>(views_->size()) : 0;
  for (int t = 0; t < tensors; ++t) {
    const models::ParamView& v = (*views_)[t];
    const int64_t lo = std::max(v.offset, bucket.begin), hi = std::min(v.offset + v.numel(), bucket.end);
    for (int64_t i = lo; i < hi; ++i)
      if (!std::isfinite(grads_[i])) return t;
  }
  return tensors;
}

}  // namespace trainer::comm
