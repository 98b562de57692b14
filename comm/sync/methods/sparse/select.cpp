#include "comm/sync/methods/sparse/select.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "comm/sync/methods/sparse/select_kernels.h"

namespace trainer::comm {

using select_kernels::Isa;
using select_kernels::OutputKernel;
using select_kernels::SelectKernel;

// ---- Which vector kernels run (select_kernels.h): decided once per process.

namespace {

constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512"};  // indexed by Isa

// The best version this CPU runs. __builtin_cpu_supports also checks that the OS saves the vector
// registers (a CPU with AVX-512 under an OS that does not enable it reports no AVX-512).
Isa cpu_isa() {
#if defined(TRAINER_SELECT_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt")) return Isa::avx2;
#endif
  return Isa::scalar;
}

// The CPU's best, capped by TRAINER_SIMD (avx512, avx2 or scalar) for benchmarks and for checking a
// path on a machine that has a better one; the variable never raises the choice above the CPU.
Isa default_isa() {
  const Isa cpu = cpu_isa();
  const char* env = std::getenv("TRAINER_SIMD");
  if (!env || !*env) return cpu;
  for (int i = 0; i < static_cast<int>(std::size(kIsaNames)); ++i)
    if (std::string(env) == kIsaNames[i]) return std::min(cpu, static_cast<Isa>(i));
  std::fprintf(stderr, "TRAINER_SIMD=%s: not avx512, avx2 or scalar; ignored\n", env);
  return cpu;
}

std::atomic<int> forced_isa{-1};  // set_selection_isa_for_testing; -1: the default

Isa active_isa() {
  static const Isa chosen = default_isa();  // once per process (a thread-safe static)
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Isa>(forced) : chosen;
}

}  // namespace

const char* selection_isa() { return kIsaNames[static_cast<int>(active_isa())]; }

std::vector<std::string> selection_isas_supported() {
  std::vector<std::string> names;
  for (int i = 0; i <= static_cast<int>(cpu_isa()); ++i) names.emplace_back(kIsaNames[i]);
  return names;
}

bool set_selection_isa_for_testing(const std::string& isa) {
  if (isa.empty()) {
    forced_isa.store(-1);
    return true;
  }
  for (int i = 0; i <= static_cast<int>(cpu_isa()); ++i)
    if (isa == kIsaNames[i]) {
      forced_isa.store(i);
      return true;
    }
  return false;
}

void SparseList::reserve(int64_t capacity) {
  if (capacity <= capacity_) return;
  std::unique_ptr<int32_t[]> index(new int32_t[capacity]);
  std::unique_ptr<float[]> value(new float[capacity]);
  if (size_ > 0) {
    std::memcpy(index.get(), index_.get(), size_ * sizeof(int32_t));
    std::memcpy(value.get(), value_.get(), size_ * sizeof(float));
  }
  index_ = std::move(index);
  value_ = std::move(value);
  capacity_ = capacity;
}

void SparseList::resize(int64_t size) {
  if (size > capacity_) reserve(std::max(size, capacity_ + capacity_ / 2));
  size_ = size;
}

float min_threshold() { return std::numeric_limits<float>::denorm_min(); }

int64_t top_k_count(double density, int64_t n) {
  const auto k = static_cast<int64_t>(std::ceil(density * static_cast<double>(n)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(n, 1));
}

float nudge_threshold(float t, int64_t count, int64_t k) {
  constexpr float kScale = 1.012f;
  if (4 * count < 3 * k) return t / kScale;
  if (4 * count > 5 * k) return t * kScale;
  return t;
}

namespace {

// Elements per capacity check: the vector kernels store 16 entries past the count unconditionally
// (a compressed vector is written whole), so the list keeps a block plus 16 spare.
constexpr int64_t kBlock = 4096;

// One thread's share [begin, end) of a selection pass (begin a multiple of 16), appended to `l`
// (cleared first) by `kernel` (select_kernels.h), a block at a time.
void select_range(SelectKernel kernel, const SelectSource& src, int64_t begin, int64_t end, float lo, SparseList& l) {
  int64_t count = 0;
  l.clear();
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t block_end = std::min(end, block + kBlock);
    if (l.capacity() < count + kBlock + 16) {
      l.resize(count);
      l.reserve(2 * (count + kBlock + 16));
    }
    count += kernel(src, block, block_end, lo, l.index() + count, l.value() + count);
  }
  l.resize(count);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint32_t magnitude_key(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;  // |v|; for non-negative floats bit order is numeric order
}

}  // namespace

// select_range over OpenMP chunks (16-aligned, contiguous, in thread order), the per-thread lists
// concatenated into `out`: thread 0 writes into `out` directly, so one thread copies nothing.
int64_t select_at_least(const SelectSource& src, int64_t n, float lo, SparseList& out, SelectScratch& s) {
  const SelectKernel kernel = select_kernels::select_kernel(active_isa(), src);  // one for all threads
  const int max_threads = n < (int64_t{1} << 16) ? 1 : omp_get_max_threads();
  if (max_threads <= 1) {
    select_range(kernel, src, 0, n, lo, out);
    return out.size();
  }
  if (static_cast<int>(s.per_thread.size()) < max_threads) s.per_thread.resize(max_threads);
  int used = 1;
#pragma omp parallel num_threads(max_threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    if (t == 0) used = T;
    const int64_t begin = (n * t / T) & ~int64_t{15};
    const int64_t end = t + 1 == T ? n : (n * (t + 1) / T) & ~int64_t{15};
    select_range(kernel, src, begin, end, lo, t == 0 ? out : s.per_thread[t]);
  }
  int64_t total = out.size();
  for (int t = 1; t < used; ++t) total += s.per_thread[t].size();
  int64_t at = out.size();
  out.resize(total);
  for (int t = 1; t < used; ++t) {
    const SparseList& l = s.per_thread[t];
    std::memcpy(out.index() + at, l.index(), l.size() * sizeof(int32_t));
    std::memcpy(out.value() + at, l.value(), l.size() * sizeof(float));
    at += l.size();
  }
  return total;
}

float sampled_lower_bound(const SelectSource& src, int64_t n, int64_t k, SelectScratch& scratch) {
  if (k >= n || n <= 0) return 0.f;
  auto x = [&](int64_t i) {
    if (!src.residual) return std::fabs(src.grad[i]);
    const bool cleared = src.clear_bits && (src.clear_bits[i >> 4] >> (i & 15) & 1u);
    return std::fabs(src.grad[i] + (cleared ? 0.f : src.residual[i]));
  };
  // Whole cache lines of 16 floats at 4096 pseudo-random places: 2^16 samples for 8192 line
  // reads (grad and residual), about a millisecond on the paper's 27.5M-entry model.
  constexpr int64_t kLines = 4096, kLine = 16, kSamples = kLines * kLine;
  std::vector<float>& m = scratch.samples;
  if (n <= 4 * kSamples) {
    // Small buffers: every entry, so the bound is the exact k-th largest magnitude.
    m.resize(n);
    for (int64_t i = 0; i < n; ++i) m[i] = x(i);
    std::nth_element(m.begin(), m.begin() + (n - k), m.end());
    return m[n - k];
  }
  m.resize(kSamples);
  const int64_t stride = n / kLines;
  for (int64_t b = 0; b < kLines; ++b) {
    const int64_t start = b * stride + static_cast<int64_t>(splitmix64(b) % static_cast<uint64_t>(stride - kLine + 1));
    for (int64_t j = 0; j < kLine; ++j) m[b * kLine + j] = x(start + j);
  }
  // Expected samples at or above the true k-th magnitude, plus a margin of about 6 standard
  // deviations of that count (neighbours in a line are correlated, so the binomial deviation is
  // an underestimate): the bound lets roughly 15-20% more than k entries through at 2% density.
  const double expected = static_cast<double>(k) * kSamples / n;
  const int64_t rank = static_cast<int64_t>(expected + 6 * std::sqrt(expected) + 16);
  if (rank >= kSamples) return 0.f;
  std::nth_element(m.begin(), m.begin() + (kSamples - 1 - rank), m.end());
  return m[kSamples - 1 - rank];
}

float kth_largest_magnitude(const SparseList& list, int64_t k, SelectScratch& scratch) {
  const int64_t m = list.size();
  const float* v = list.value();
  auto& mag = scratch.magnitudes;
  if (m < (int64_t{1} << 15)) {
    if (static_cast<int64_t>(mag.size()) < m) mag.resize(m);
    for (int64_t i = 0; i < m; ++i) mag[i] = std::fabs(v[i]);
    std::nth_element(mag.begin(), mag.begin() + (m - k), mag.begin() + m);
    return mag[m - k];
  }
  // Top 16 bits of |v| (sign clear: 32768 buckets, 1/128 of an octave each): walk down from the
  // largest bucket to the one holding the k-th, then nth_element over that bucket only.
  auto& hist = scratch.histogram;
  hist.assign(32768, 0);
  for (int64_t i = 0; i < m; ++i) ++hist[magnitude_key(v[i]) >> 16];
  int64_t remaining = k;
  int bucket = 32767;
  for (; bucket > 0 && hist[bucket] < remaining; --bucket) remaining -= hist[bucket];
  const int64_t c = hist[bucket];
  if (static_cast<int64_t>(mag.size()) < c) mag.resize(c);
  int64_t at = 0;
  for (int64_t i = 0; i < m; ++i)
    if (static_cast<int>(magnitude_key(v[i]) >> 16) == bucket) mag[at++] = std::fabs(v[i]);
  std::nth_element(mag.begin(), mag.begin() + (c - remaining), mag.begin() + c);
  return mag[c - remaining];
}

int64_t keep_at_least(SparseList& list, float t) {
  t = std::max(t, min_threshold());
  int32_t* index = list.index();
  float* value = list.value();
  int64_t kept = 0;
  for (int64_t i = 0; i < list.size(); ++i) {
    index[kept] = index[i];
    value[kept] = value[i];
    kept += std::fabs(value[i]) >= t;
  }
  list.resize(kept);
  return kept;
}

void keep_top_k(SparseList& list, int64_t k, SelectScratch& scratch, uint32_t* payload, int words) {
  if (k >= list.size()) return;
  const float t = kth_largest_magnitude(list, k, scratch);
  int32_t* index = list.index();
  float* value = list.value();
  int64_t above = 0;
  for (int64_t i = 0; i < list.size(); ++i) above += std::fabs(value[i]) > t;
  int64_t ties = k - above;  // entries equal to t still to keep, lowest indices first
  int64_t kept = 0;
  for (int64_t i = 0; i < list.size(); ++i) {
    const float a = std::fabs(value[i]);
    if (a > t || (a == t && ties-- > 0)) {
      index[kept] = index[i];
      value[kept] = value[i];
      if (payload) std::memmove(payload + kept * words, payload + i * words, words * sizeof(uint32_t));
      ++kept;
    }
  }
  list.resize(kept);
}

float select_top_k(const SelectSource& src, int64_t n, int64_t k, bool exactly_k, SparseList& out,
                   SelectScratch& scratch) {
  out.clear();
  if (n <= 0) return 0.f;
  k = std::clamp<int64_t>(k, 1, n);
  const float floor = exactly_k ? 0.f : min_threshold();
  float lo = std::max(floor, sampled_lower_bound(src, n, k, scratch));
  int64_t count = select_at_least(src, n, lo, out, scratch);
  // An unlucky sample: fewer than k entries reached the bound. Lower it and read again (an
  // accumulated x is in the residual by now); after two tries take everything eligible.
  const SelectSource again = read_only(src.residual ? src.residual : src.grad);
  for (int attempt = 0; count < k && lo > floor; ++attempt) {
    lo = attempt < 2 ? std::max(floor, lo * 0.25f) : floor;
    count = select_at_least(again, n, lo, out, scratch);
  }
  if (count < k) {  // fewer than k nonzero entries (threshold rule): all of them
    float t = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < count; ++i) t = std::min(t, std::fabs(out.value()[i]));
    return count ? t : floor;
  }
  const float t = kth_largest_magnitude(out, k, scratch);
  if (exactly_k)
    keep_top_k(out, k, scratch);
  else
    keep_at_least(out, t);
  return t;
}

void merge_sum(const int32_t* ai, const float* av, int64_t na, const int32_t* bi, const float* bv, int64_t nb,
               SparseList& out) {
  out.resize(na + nb);
  int32_t* oi = out.index();
  float* ov = out.value();
  int64_t a = 0, b = 0, o = 0;
  while (a < na && b < nb) {
    if (ai[a] < bi[b]) {
      oi[o] = ai[a];
      ov[o++] = av[a++];
    } else if (bi[b] < ai[a]) {
      oi[o] = bi[b];
      ov[o++] = bv[b++];
    } else {
      oi[o] = ai[a];
      ov[o++] = av[a++] + bv[b++];
    }
  }
  const int64_t ra = na - a, rb = nb - b;
  std::memcpy(oi + o, ai + a, ra * sizeof(int32_t));
  std::memcpy(ov + o, av + a, ra * sizeof(float));
  o += ra;
  std::memcpy(oi + o, bi + b, rb * sizeof(int32_t));
  std::memcpy(ov + o, bv + b, rb * sizeof(float));
  o += rb;
  out.resize(o);
}

void merge_sum_all(const std::vector<ListRef>& lists, SparseList& out, SparseList& tmp) {
  const size_t count = lists.size();
  if (count == 0) {
    out.clear();
    return;
  }
  if (count == 1) {
    out.resize(lists[0].size);
    std::memcpy(out.index(), lists[0].index, lists[0].size * sizeof(int32_t));
    std::memcpy(out.value(), lists[0].value, lists[0].size * sizeof(float));
    return;
  }
  if (count > 16) {
    // Pairwise, ping-ponging so that the last merge lands in `out`.
    const size_t merges = count - 1;
    SparseList* dst = merges % 2 == 1 ? &out : &tmp;
    SparseList* other = merges % 2 == 1 ? &tmp : &out;
    merge_sum(lists[0].index, lists[0].value, lists[0].size, lists[1].index, lists[1].value, lists[1].size, *dst);
    for (size_t j = 2; j < count; ++j) {
      std::swap(dst, other);
      merge_sum(other->index(), other->value(), other->size(), lists[j].index, lists[j].value, lists[j].size, *dst);
    }
    return;
  }
  // One pass over all lists at once (P is small): each output index is the smallest head; the
  // lists holding it add their values in list order. Exhausted lists show an index no entry has.
  constexpr int32_t kDone = std::numeric_limits<int32_t>::max();
  int64_t total = 0, pos[16] = {};
  int32_t head[16];
  for (size_t j = 0; j < count; ++j) {
    total += lists[j].size;
    head[j] = lists[j].size > 0 ? lists[j].index[0] : kDone;
  }
  out.resize(total);
  int32_t* oi = out.index();
  float* ov = out.value();
  int64_t o = 0;
  for (;;) {
    int32_t m = head[0];
    for (size_t j = 1; j < count; ++j) m = std::min(m, head[j]);
    if (m == kDone) break;
    float v = 0.f;
    bool first = true;
    for (size_t j = 0; j < count; ++j) {
      if (head[j] != m) continue;
      const float x = lists[j].value[pos[j]];
      v = first ? x : v + x;
      first = false;
      ++pos[j];
      head[j] = pos[j] < lists[j].size ? lists[j].index[pos[j]] : kDone;
    }
    oi[o] = m;
    ov[o++] = v;
  }
  out.resize(o);
}

int64_t write_sparse_output(float* dst, int64_t n, const std::vector<ListRef>& runs, float divisor, OutputScratch& s,
                            uint16_t* mine, uint16_t* clear) {
  const int64_t words = (n + 15) / 16;
  if (static_cast<int64_t>(s.bits.size()) < words) s.bits.assign(words, 0);
  int64_t total = 0;
  for (const auto& r : runs) total += r.size;
  // 16 spare values: the vector loop loads 16 at a time from the current position.
  if (static_cast<int64_t>(s.value.size()) < total + 16) s.value.resize(total + 16);
  if (static_cast<int64_t>(s.index.size()) < total) s.index.resize(total);
  int64_t q = 0;
  for (const auto& r : runs)
    for (int64_t j = 0; j < r.size; ++j, ++q) {
      set_flag(s.bits.data(), r.index[j]);
      s.index[q] = r.index[j];
      s.value[q] = r.value[j] / divisor;
    }
  uint16_t* bits = s.bits.data();
  const int32_t* index = s.index.data();
  const bool stream = reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  const select_kernels::OutputWords output{dst, bits, s.value.data(), mine, clear, stream};
  const OutputKernel kernel = select_kernels::output_kernel(active_isa());
  const int64_t full = n / 16;  // whole words; the last partial one is written entry by entry
  int64_t common = 0;
#pragma omp parallel reduction(+ : common)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t w0 = full * t / T, w1 = full * (t + 1) / T;
    // Where this chunk's values start: entries below its first index.
    const int64_t at = std::lower_bound(index, index + total, static_cast<int32_t>(16 * w0)) - index;
    common += kernel(output, w0, w1, at);
  }
  if (full < words) {
    int64_t at = std::lower_bound(index, index + total, static_cast<int32_t>(16 * full)) - index;
    for (int64_t i = 16 * full; i < n; ++i) dst[i] = (bits[full] >> (i & 15) & 1u) ? s.value[at++] : 0.f;
    common += select_kernels::contributed(output, full);
    bits[full] = 0;
  }
  return common;
}

}  // namespace trainer::comm
