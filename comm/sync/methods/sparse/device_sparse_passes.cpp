// The device passes of sparse_passes.h: backend ops on a residual in device memory, with only the
// selected (index, value) lists and 1 KB histograms crossing to the host.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "comm/sync/methods/sparse/sparse_passes.h"
#include "models/device_buffer.h"

namespace trainer::comm {
namespace {

float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// int32 lists in a DeviceBuffer (float-sized slots).
int32_t* ints(models::DeviceBuffer& b) { return reinterpret_cast<int32_t*>(b.data()); }

class DeviceSparsePasses final : public SparsePasses {
 public:
  DeviceSparsePasses(models::Backend& backend, int64_t n)
      : SparsePasses(n),
        backend_(backend),
        index_(backend),
        value_(backend),
        histogram_(backend, 256),
        output_index_(backend),
        output_value_(backend),
        cleared_(backend) {}

  void begin(float* grad, ErrorFeedback::Step& ef) override {
    grad_ = grad;
    ef_ = &ef;
    acc_ = nullptr;
  }

  int64_t select_at_least(float lo, SparseList& out) override {
    const float* fuse = nullptr;
    float* acc = formed_acc(fuse);
    int64_t count = backend_.select_at_least(n_, fuse, acc, lo, ints(index_), value_.data(), index_.size());
    if (count > index_.size()) {  // the lists grow (by half again) and the formed acc is read again
      const int64_t room = count + count / 2;
      index_.resize(room);
      value_.resize(room);
      count = backend_.select_at_least(n_, nullptr, acc, lo, ints(index_), value_.data(), room);
    }
    out.resize(count);
    backend_.copy_to_host(out.index(), index_.data(), count * sizeof(int32_t));
    backend_.copy_to_host(out.value(), value_.data(), count * sizeof(float));
    backend_.synchronize();
    return count;
  }

  // select.h's select_top_k: the host finds t by sampling, collecting a superset and taking the
  // k-th largest of it; here t comes exact from the radix select, then one collection at t. The
  // lists and t are the same (see select_top_k's rules in select.h).
  float select_top_k(int64_t k, bool exactly_k, SparseList& out) override {
    out.clear();
    if (n_ <= 0) return 0.f;
    k = std::clamp<int64_t>(k, 1, n_);
    const float floor = exactly_k ? 0.f : min_threshold();
    // The threshold rule never selects zeros: keys from 1 (the smallest denormal) up.
    const uint32_t min_key = exactly_k ? 0u : 1u;
    const float* fuse = nullptr;
    float* acc = formed_acc(fuse);
    count_digits(fuse, acc, min_key, 0, 0, 24);
    int64_t eligible = 0;
    for (int32_t h : host_histogram_) eligible += h;
    if (eligible == 0) return floor;
    // Fewer than k eligible entries: all of them, and t is the smallest (the eligible-th largest).
    const float t = kth_largest_key(acc, min_key, std::min(k, eligible));
    select_at_least(t, out);
    if (eligible >= k && exactly_k) keep_top_k(out, k, scratch_);  // ties at t by lower index
    return t;
  }

  int64_t write_output(const std::vector<ListRef>& runs, float divisor, const SparseList* mine) override {
    // The runs, concatenated, are the output in index order (each run above the one before).
    int64_t total = 0;
    for (const ListRef& run : runs) total += run.size;
    staged_index_.resize(static_cast<size_t>(total));
    staged_value_.resize(static_cast<size_t>(total));
    int64_t at = 0;
    for (const ListRef& run : runs) {
      std::copy(run.index, run.index + run.size, staged_index_.begin() + at);
      std::copy(run.value, run.value + run.size, staged_value_.begin() + at);
      at += run.size;
    }
    output_index_.reserve(total);
    output_value_.reserve(total);
    backend_.copy_to_device(output_index_.data(), staged_index_.data(), total * sizeof(int32_t));
    backend_.copy_to_device(output_value_.data(), staged_value_.data(), total * sizeof(float));
    backend_.sparse_to_dense(n_, total, ints(output_index_), output_value_.data(), divisor, grad_);
    if (!mine) return 0;
    // What this rank contributed: its selection's entries in the output (both lists index-sorted).
    staged_clear_.clear();
    const int32_t* m = mine->index();
    int64_t i = 0, j = 0;
    while (i < mine->size() && j < total) {
      if (m[i] < staged_index_[j]) {
        ++i;
      } else if (staged_index_[j] < m[i]) {
        ++j;
      } else {
        staged_clear_.push_back(m[i]);
        ++i, ++j;
      }
    }
    clear(staged_clear_.data(), static_cast<int64_t>(staged_clear_.size()));
    return static_cast<int64_t>(staged_clear_.size());
  }

  void sent(const int32_t* index, int64_t count) override {
    staged_clear_.assign(index, index + count);
    clear(staged_clear_.data(), count);
  }

 private:
  // The step's first pass forms acc = grad + residual on the device (`fuse` is the gradient then,
  // else null); later passes read it.
  float* formed_acc(const float*& fuse) {
    fuse = nullptr;
    if (!acc_) {
      acc_ = ef_->on_device();
      fuse = grad_;
    }
    return acc_;
  }

  void accumulate_moments(double* sums) override {
    const float* fuse = nullptr;
    float* acc = formed_acc(fuse);
    if (!fuse) throw std::logic_error("sparse passes: moments of an acc formed earlier in the step");
    backend_.accumulate_moments(n_, fuse, acc, sums);
  }

  // One radix-select round: host_histogram_ = the digit at `shift` of the eligible keys under `prefix`.
  void count_digits(const float* fuse, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix, int shift) {
    auto* device_histogram = reinterpret_cast<int32_t*>(histogram_.data());
    backend_.magnitude_histogram(n_, fuse, acc, min_key, mask, prefix, shift, device_histogram);
    backend_.copy_to_host(host_histogram_.data(), device_histogram, sizeof(int32_t) * 256);
    backend_.synchronize();
  }

  // The rank-th largest eligible key (1 <= rank <= the eligible count), 8 bits a round from the top;
  // host_histogram_ holds the first round's digits (count_digits at shift 24) on entry.
  float kth_largest_key(float* acc, uint32_t min_key, int64_t rank) {
    uint32_t prefix = 0, mask = 0;
    int64_t remaining = rank;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (shift != 24) count_digits(nullptr, acc, min_key, mask, prefix, shift);
      int digit = 255;
      for (; digit > 0 && host_histogram_[digit] < remaining; --digit) remaining -= host_histogram_[digit];
      prefix |= static_cast<uint32_t>(digit) << shift;
      mask |= 255u << shift;
    }
    return from_bits(prefix);
  }

  // residual = 0 at these indices (host, staged until the copy is done: the next step's first
  // pass waits for the device before the staging is reused).
  void clear(const int32_t* index, int64_t count) {
    if (count == 0) return;
    cleared_.reserve(count);
    backend_.copy_to_device(cleared_.data(), index, count * sizeof(int32_t));
    backend_.scatter_fill(count, ints(cleared_), 0.f, acc_);
    // DGC's momentum masking (dgc.h): the velocity is cleared where the residual is.
    if (float* velocity = ef_->cleared_with()) backend_.scatter_fill(count, ints(cleared_), 0.f, velocity);
  }

  models::Backend& backend_;
  float* grad_ = nullptr;
  ErrorFeedback::Step* ef_ = nullptr;
  float* acc_ = nullptr;
  models::DeviceBuffer index_, value_, histogram_;
  models::DeviceBuffer output_index_, output_value_, cleared_;
  std::vector<int32_t> host_histogram_ = std::vector<int32_t>(256);
  std::vector<int32_t> staged_index_, staged_clear_;
  std::vector<float> staged_value_;
  SelectScratch scratch_;
};

}  // namespace

std::unique_ptr<SparsePasses> make_device_sparse_passes(models::Backend& backend, int64_t n) {
  return std::make_unique<DeviceSparsePasses>(backend, n);
}

}  // namespace trainer::comm
