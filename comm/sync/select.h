// Selection kernels shared by the sparse gradient-sync methods (oktopk, topka, gaussiank, gtopk):
// picking the large-magnitude entries of a gradient-sized buffer, finding an exact k-th largest
// magnitude, and the small operations on sorted (index, value) lists the methods build from them.
//
// The rules every method relies on:
// - Selection never sorts the gradient. A selection is one streaming pass that appends every entry
//   with |x| >= lo to a list, in index order (AVX-512 compress where the CPU has it, OpenMP chunks
//   concatenated in thread order). An exact k-th largest magnitude comes from sampling first (a
//   lower bound lo that lets a little more than k entries through, with a safety margin), then that
//   one pass, then std::nth_element over the few collected entries only; if the sample was unlucky
//   (fewer than k entries reach lo) the pass is repeated with a lower bound, which only costs time.
// - Threshold rule: an entry is selected when |x| >= t. With t the exact k-th largest magnitude
//   this keeps at least k entries; ties at t are all kept. Exact zeros are never selected by a
//   threshold (t is raised to the smallest denormal), since sending a zero changes nothing.
// - Exactly-k rule (topka, gtopk, where every rank must send the same count): the k largest
//   magnitudes, ties at the k-th magnitude broken by lower index; zeros are taken (lowest indices
//   first) only when fewer than k entries are nonzero.
// - Lists are sorted by index and sums over ranks are formed in rank order (((0 + x_0) + x_1) + ...),
//   so every rank, and a dense reference computed the same way, gets bitwise the same floats.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace trainer::comm {

// A sparse vector: int32 indices (n < 2^31) and float values in two arrays, sorted by index, with
// storage that only grows, so a method reusing its lists allocates nothing per step once warm.
class SparseList {
 public:
  int64_t size() const { return size_; }
  int32_t* index() { return index_.get(); }
  float* value() { return value_.get(); }
  const int32_t* index() const { return index_.get(); }
  const float* value() const { return value_.get(); }
  // Sets the size, growing the storage (by at least half again) when needed; the first
  // min(old size, new size) entries are kept, new entries are uninitialized.
  void resize(int64_t size);
  // Grows the storage to hold `capacity` entries, keeping the current ones.
  void reserve(int64_t capacity);
  int64_t capacity() const { return capacity_; }
  void clear() { size_ = 0; }

 private:
  std::unique_ptr<int32_t[]> index_;
  std::unique_ptr<float[]> value_;
  int64_t size_ = 0, capacity_ = 0;
};

// Per-thread lists and a magnitude buffer, kept between calls so that steady-state steps do not
// allocate.
struct SelectScratch {
  std::vector<SparseList> per_thread;
  std::vector<float> magnitudes;
};

// acc = grad + residual in one pass: residual[i] = acc, grad[i] = 0 (the caller scatters its output
// into grad afterwards), and every i with |acc| >= lo appended to `out` (which is cleared first).
// `residual` may be null: then acc = grad and grad is left untouched. Returns out.size().
int64_t accumulate_and_select(float* grad, float* residual, int64_t n, float lo, SparseList& out,
                              SelectScratch& scratch);

// The read-only form: appends every i with |x[i]| >= lo to `out` (cleared first).
int64_t select_at_least(const float* x, int64_t n, float lo, SparseList& out, SelectScratch& scratch);

// A lower bound for the k-th largest |grad + residual| (residual may be null) from about 2^16
// deterministic samples: with high probability at least k and not many more than k entries reach
// it. Exact (the k-th largest itself) when n is small enough to sample everything. 0 when k is
// close to n.
float sampled_lower_bound(const float* grad, const float* residual, int64_t n, int64_t k);

// The k-th largest |value| of a list (1 <= k <= size), by nth_element on a copy of the magnitudes.
float kth_largest_magnitude(const SparseList& list, int64_t k, SelectScratch& scratch);

// The threshold rule of the list's own entries: keeps the entries with |v| >= max(t, denormal min),
// in order. Returns the new size.
int64_t keep_at_least(SparseList& list, float t);

// The exactly-k rule on a list (k <= size): keeps the k largest magnitudes, ties at the k-th
// magnitude by lower index (the list is in index order), in order. `payload`, when given, holds
// `words` uint32 per entry that are kept (compacted) alongside.
void keep_top_k(SparseList& list, int64_t k, SelectScratch& scratch, uint32_t* payload = nullptr, int words = 0);

// Exact local selection of a gradient-sized buffer: acc = grad + residual as accumulate_and_select
// (fused = true), or x = residual read only (fused = false, grad ignored), then the exact k-th
// largest magnitude t. exactly_k = false: `out` holds the threshold rule's entries (|acc| >= t,
// nonzero); true: exactly k entries by the exactly-k rule. Returns t.
float select_top_k(float* grad, float* residual, int64_t n, int64_t k, bool fused, bool exactly_k,
                   SparseList& out, SelectScratch& scratch);

// out = a + b for index-sorted lists: the union of indices, sorted, with a's value + b's value
// where both have an entry. `out` must be neither input.
void merge_sum(const int32_t* a_index, const float* a_value, int64_t a_size, const int32_t* b_index,
               const float* b_value, int64_t b_size, SparseList& out);

// Sums index-sorted lists in list order (the rank order of the sum) into `out`, using `tmp` as
// the ping-pong buffer. A list is (index, value, size).
struct ListRef {
  const int32_t* index;
  const float* value;
  int64_t size;
};
void merge_sum_all(const std::vector<ListRef>& lists, SparseList& out, SparseList& tmp);

// dst[index[j]] = value[j] / divisor for the list's (unique) indices.
void scatter_divided(float* dst, const int32_t* index, const float* value, int64_t size, float divisor);

// k = ceil(density * n), clamped to [1, n] (n >= 1).
int64_t top_k_count(double density, int64_t n);

// The threshold nudge between exact recomputations (DESIGN.md section 4): a count under 3k/4
// lowers t by the factor 1.012, a count over 5k/4 raises it; the result applies to the next step.
float nudge_threshold(float t, int64_t count, int64_t k);

// The smallest float above zero: the lowest threshold a selection uses (zeros are never sent).
float min_threshold();

}  // namespace trainer::comm
