// Selection kernels shared by the sparse gradient-sync methods (oktopk, topka, gaussiank, gtopk):
// picking the large-magnitude entries of a gradient-sized buffer, finding an exact k-th largest
// magnitude, and the small operations on sorted (index, value) lists the methods build from them.
//
// The rules every method relies on:
// - Selection never sorts the gradient. A selection is one streaming pass that appends every entry
//   with |x| >= lo to a list, in index order (a vector compress, AVX-512 or AVX2 as the CPU has
//   it: selection_isa(); OpenMP chunks concatenated in thread order); error feedback's
//   acc = grad + residual is formed in the same pass. An exact k-th largest magnitude comes from
//   sampling first (a lower bound lo that lets a little more than k entries through, with a safety
//   margin), then that one pass, then a histogram and std::nth_element over the collected entries
//   only; if the sample was unlucky (fewer than k entries reach lo) the pass is repeated with a
//   lower bound, which only costs time.
// - On CPUs memory traffic is the cost: per step a method reads grad and residual and writes the
//   residual and the dense output once each, all as streams. Residual clears are deferred into
//   the next pass as bit flags; the output is written in one pass (write_sparse_output).
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
#include <string>
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

// Per-thread lists and buffers, kept between calls so that steady-state steps do not allocate.
struct SelectScratch {
  std::vector<SparseList> per_thread;
  std::vector<float> magnitudes;
  std::vector<float> samples;
  std::vector<int32_t> histogram;
};

// Where a selection pass reads its values. Plain: x = grad, read only. Accumulating (residual
// set): x = grad + residual is formed in the pass and written back into the residual (error
// feedback's acc, with no pass of its own); entries flagged in clear_bits (one bit per entry, 16
// per word: ErrorFeedback's deferred clears) count as a zero residual, and the pass resets the
// flags. The gradient itself is never written.
struct SelectSource {
  const float* grad = nullptr;
  float* residual = nullptr;
  uint16_t* clear_bits = nullptr;
};
inline SelectSource read_only(const float* x) { return {x, nullptr, nullptr}; }
inline void set_flag(uint16_t* bits, int64_t i) { bits[i >> 4] |= static_cast<uint16_t>(1u << (i & 15)); }

// One pass: appends every i with |x_i| >= lo to `out` (cleared first), in index order. Returns the
// count.
int64_t select_at_least(const SelectSource& source, int64_t n, float lo, SparseList& out, SelectScratch& scratch);

// A lower bound for the k-th largest |x| from about 2^16 deterministic samples (x as the source
// would form it, read without writing): with high probability at least k and not many more than
// k entries reach it. Exact (the k-th largest itself) when n is small enough to sample
// everything. 0 when k >= n.
float sampled_lower_bound(const SelectSource& source, int64_t n, int64_t k, SelectScratch& scratch);

// The k-th largest |value| of a list (1 <= k <= size): a histogram of the top 16 bits of the
// magnitudes, then nth_element within the one bucket that holds it.
float kth_largest_magnitude(const SparseList& list, int64_t k, SelectScratch& scratch);

// The threshold rule of the list's own entries: keeps the entries with |v| >= max(t, denormal min),
// in order. Returns the new size.
int64_t keep_at_least(SparseList& list, float t);

// The exactly-k rule on a list (k <= size): keeps the k largest magnitudes, ties at the k-th
// magnitude by lower index (the list is in index order), in order. `payload`, when given, holds
// `words` uint32 per entry that are kept (compacted) alongside.
void keep_top_k(SparseList& list, int64_t k, SelectScratch& scratch, uint32_t* payload = nullptr, int words = 0);

// Exact selection: sampled bound, one pass of the source, then the exact k-th largest magnitude t
// among the collected entries (if fewer than k were collected, the pass is repeated with a lower
// bound, reading the accumulated values back from the residual). exactly_k = false: `out` holds
// the threshold rule's entries (|x| >= t, nonzero); true: exactly k entries by the exactly-k rule.
// Returns t.
float select_top_k(const SelectSource& source, int64_t n, int64_t k, bool exactly_k, SparseList& out,
                   SelectScratch& scratch);

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

// The dense output of a sparse step: dst[i] = value / divisor at the listed indices, 0 elsewhere,
// in one streaming pass (non-temporal stores when dst is 64-byte aligned) rather than a zero fill
// plus scattered writes. `runs` are index-sorted lists of unique indices, each run's indices above
// the previous run's. With `mine` (flags of this rank's own selection, reset by the pass) and
// `clear` (error feedback's deferred clears), the same pass flags in `clear` every entry of this
// rank's selection that is in the output, and returns how many (else 0).
struct OutputScratch {
  std::vector<uint16_t> bits;  // one flag per entry; all zero between calls
  std::vector<int32_t> index;
  std::vector<float> value;
};
int64_t write_sparse_output(float* dst, int64_t n, const std::vector<ListRef>& runs, float divisor,
                            OutputScratch& scratch, uint16_t* mine = nullptr, uint16_t* clear = nullptr);

// k = ceil(density * n), clamped to [1, n] (n >= 1).
int64_t top_k_count(double density, int64_t n);

// The threshold nudge between exact recomputations (docs/architecture.md section 4): a count under 3k/4
// lowers t by the factor 1.012, a count over 5k/4 raises it; the result applies to the next step.
float nudge_threshold(float t, int64_t count, int64_t k);

// The smallest float above zero: the lowest threshold a selection uses (zeros are never sent).
float min_threshold();

// The instruction set of the selection pass and the dense output (comm/sync/methods/sparse/select_kernels.h):
// "avx512", "avx2" or "scalar". Chosen once per process, the best the CPU runs whatever -march the
// binary was built with; the environment variable TRAINER_SIMD=avx512|avx2|scalar caps the choice
// (never raising it above the CPU's). Every choice gives bitwise the same results.
const char* selection_isa();

// Tests and benchmarks: the instruction sets this CPU runs, scalar first (TRAINER_SIMD aside); and
// forcing one of them in this process ("" returns to the default). Returns false, changing nothing,
// for a name not in selection_isas_supported().
std::vector<std::string> selection_isas_supported();
bool set_selection_isa_for_testing(const std::string& isa);

}  // namespace trainer::comm
