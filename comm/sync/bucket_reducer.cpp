#include "comm/sync/bucket_reducer.h"

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

void BucketReducer::run_all(float* grads) {
  std::fill(ready_us_.begin(), ready_us_.end(), -1);
  for (size_t b = 0; b < plan_.size(); ++b) job_(b, grads);
}

void BucketReducer::begin(float* grads) {
  if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
  std::lock_guard<std::mutex> lock(mutex_);
  grads_ = grads;
  handed_ = reduced_ = 0;
  nonfinite_tensor_ = -1;
}

void BucketReducer::ready(int64_t from) {
  size_t handed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t now = comm_.log().now_us();
    while (handed_ < plan_.size() && plan_[handed_].begin >= from) ready_us_[handed_++] = now;
    handed = handed_;
  }
  if (handed > 0) work_.notify_one();
}

int BucketReducer::finish() {
  ready(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return reduced_ == plan_.size() || error_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return nonfinite_tensor_;
}

void BucketReducer::serve() {
  omp_set_num_threads(1);  // this thread's own loops run on it alone
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
