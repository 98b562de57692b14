#include "comm/sync/select.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace trainer::comm {

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

// Elements per capacity check: the vector loop stores 16 entries past the count unconditionally
// (the compress result is written whole), so the list keeps a block plus 16 spare.
constexpr int64_t kBlock = 4096;

// One thread's share [begin, end) of a selection pass, appended to `l` (cleared first). Fused:
// x = grad + residual is written back to residual and grad is zeroed. Branch-free: every element
// writes its candidate slot and the count advances by the comparison, so a 2% selection rate
// costs no branch mispredictions.
template <bool kFused>
void select_range(float* grad, float* residual, int64_t begin, int64_t end, float lo, SparseList& l) {
  int64_t count = 0;
  l.clear();
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t block_end = std::min(end, block + kBlock);
    if (l.capacity() < count + kBlock + 16) {
      l.resize(count);
      l.reserve(2 * (count + kBlock + 16));
    }
    int32_t* out_index = l.index();
    float* out_value = l.value();
    int64_t i = block;
#if defined(__AVX512F__)
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 vlo = _mm512_set1_ps(lo);
    for (; i + 16 <= block_end; i += 16) {
      __m512 a = _mm512_loadu_ps(grad + i);
      if constexpr (kFused) {
        a = _mm512_add_ps(a, _mm512_loadu_ps(residual + i));
        _mm512_storeu_ps(residual + i, a);
        _mm512_storeu_ps(grad + i, _mm512_setzero_ps());
      }
      const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(a), vlo, _CMP_GE_OQ);
      _mm512_storeu_ps(out_value + count, _mm512_maskz_compress_ps(m, a));
      const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)), iota);
      _mm512_storeu_si512(out_index + count, _mm512_maskz_compress_epi32(m, idx));
      count += __builtin_popcount(m);
    }
#endif
    for (; i < block_end; ++i) {
      float a = grad[i];
      if constexpr (kFused) {
        a += residual[i];
        residual[i] = a;
        grad[i] = 0.f;
      }
      out_index[count] = static_cast<int32_t>(i);
      out_value[count] = a;
      count += std::fabs(a) >= lo;
    }
  }
  l.resize(count);
}

// Runs select_range over OpenMP chunks (16-aligned, contiguous, in thread order) and concatenates
// the per-thread lists into `out`: thread 0 writes into `out` directly, so one thread copies nothing.
template <bool kFused>
int64_t select_parallel(float* grad, float* residual, int64_t n, float lo, SparseList& out, SelectScratch& s) {
  const int max_threads = n < (int64_t{1} << 16) ? 1 : omp_get_max_threads();
  if (max_threads <= 1) {
    select_range<kFused>(grad, residual, 0, n, lo, out);
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
    select_range<kFused>(grad, residual, begin, end, lo, t == 0 ? out : s.per_thread[t]);
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

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

int64_t accumulate_and_select(float* grad, float* residual, int64_t n, float lo, SparseList& out,
                              SelectScratch& scratch) {
  if (residual == nullptr) return select_parallel<false>(grad, nullptr, n, lo, out, scratch);
  return select_parallel<true>(grad, residual, n, lo, out, scratch);
}

int64_t select_at_least(const float* x, int64_t n, float lo, SparseList& out, SelectScratch& scratch) {
  // The read-only instantiation never writes through the pointer.
  return select_parallel<false>(const_cast<float*>(x), nullptr, n, lo, out, scratch);
}

float sampled_lower_bound(const float* grad, const float* residual, int64_t n, int64_t k) {
  if (k >= n || n <= 0) return 0.f;
  auto acc = [&](int64_t i) { return std::fabs(residual ? grad[i] + residual[i] : grad[i]); };
  // Whole cache lines of 16 floats at 4096 pseudo-random places: 2^16 samples for 8192 line
  // reads (grad and residual), about a millisecond on the paper's 27.5M-entry model.
  constexpr int64_t kLines = 4096, kLine = 16, kSamples = kLines * kLine;
  std::vector<float> m;
  if (n <= 4 * kSamples) {
    // Small buffers: every entry, so the bound is the exact k-th largest magnitude.
    m.resize(n);
    for (int64_t i = 0; i < n; ++i) m[i] = acc(i);
    std::nth_element(m.begin(), m.begin() + (n - k), m.end());
    return m[n - k];
  }
  m.resize(kSamples);
  const int64_t stride = n / kLines;
  for (int64_t b = 0; b < kLines; ++b) {
    const int64_t start = b * stride + static_cast<int64_t>(splitmix64(b) % static_cast<uint64_t>(stride - kLine + 1));
    for (int64_t j = 0; j < kLine; ++j) m[b * kLine + j] = acc(start + j);
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
  auto& mag = scratch.magnitudes;
  if (static_cast<int64_t>(mag.size()) < m) mag.resize(m);
  const float* v = list.value();
  for (int64_t i = 0; i < m; ++i) mag[i] = std::fabs(v[i]);
  std::nth_element(mag.begin(), mag.begin() + (m - k), mag.begin() + m);
  return mag[m - k];
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

float select_top_k(float* grad, float* residual, int64_t n, int64_t k, bool fused, bool exactly_k,
                   SparseList& out, SelectScratch& scratch) {
  out.clear();
  if (n <= 0) return 0.f;
  k = std::clamp<int64_t>(k, 1, n);
  const float floor = exactly_k ? 0.f : min_threshold();
  const float* x = fused ? (residual ? residual : grad) : residual;
  float lo = std::max(floor, fused ? sampled_lower_bound(grad, residual, n, k) : sampled_lower_bound(x, nullptr, n, k));
  int64_t count = fused ? accumulate_and_select(grad, residual, n, lo, out, scratch)
                        : select_at_least(x, n, lo, out, scratch);
  // An unlucky sample: fewer than k entries reached the bound. Lower it and read again (acc is
  // already in place); after two tries take everything eligible.
  for (int attempt = 0; count < k && lo > floor; ++attempt) {
    lo = attempt < 2 ? std::max(floor, lo * 0.25f) : floor;
    count = select_at_least(x, n, lo, out, scratch);
  }
  if (count < k) {  // fewer than k nonzero entries (threshold rule): all of them
    float t = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < count; ++i) t = std::min(t, std::fabs(out.value()[i]));
    return count ? t : floor;
  }
  const float t = kth_largest_magnitude(out, k, scratch);
  if (exactly_k) keep_top_k(out, k, scratch);
  else keep_at_least(out, t);
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
  if (lists.empty()) {
    out.clear();
    return;
  }
  const int64_t merges = static_cast<int64_t>(lists.size()) - 1;
  if (merges == 0) {
    out.resize(lists[0].size);
    std::memcpy(out.index(), lists[0].index, lists[0].size * sizeof(int32_t));
    std::memcpy(out.value(), lists[0].value, lists[0].size * sizeof(float));
    return;
  }
  // Ping-pong so that the last merge lands in `out`.
  SparseList* dst = merges % 2 == 1 ? &out : &tmp;
  SparseList* other = merges % 2 == 1 ? &tmp : &out;
  merge_sum(lists[0].index, lists[0].value, lists[0].size, lists[1].index, lists[1].value, lists[1].size, *dst);
  for (size_t j = 2; j < lists.size(); ++j) {
    std::swap(dst, other);
    merge_sum(other->index(), other->value(), other->size(), lists[j].index, lists[j].value, lists[j].size, *dst);
  }
}

void scatter_divided(float* dst, const int32_t* index, const float* value, int64_t size, float divisor) {
  for (int64_t j = 0; j < size; ++j) dst[index[j]] = value[j] / divisor;
}

}  // namespace trainer::comm
