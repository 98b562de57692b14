// The selection kernels of the sparse gradient-sync methods (comm/sync/methods/sparse/select.h) against plain
// definitions computed the slow way: threshold passes, the exact k-th magnitude (small buffers
// and sampled large ones), the two tie rules, sorted-list sums, and the error-feedback residual;
// and each instruction set's kernels (scalar, AVX2, AVX-512, as the CPU has them) against the
// scalar ones, bit for bit.
#include "comm/sync/methods/sparse/select.h"

#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/sync/wrappers/error_feedback.h"
#include "comm/sync/methods/sparse/gaussiank.h"
#include "comm/sync/gradient_sync.h"

using namespace trainer::comm;

namespace {

std::vector<float> normal_vector(int64_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// The k-th largest |x| by sorting everything: the definition.
float kth_by_sort(const std::vector<float>& x, int64_t k) {
  std::vector<float> m(x.size());
  for (size_t i = 0; i < x.size(); ++i) m[i] = std::fabs(x[i]);
  std::sort(m.begin(), m.end(), std::greater<float>());
  return m[k - 1];
}

std::vector<int32_t> indices(const SparseList& l) { return {l.index(), l.index() + l.size()}; }

std::vector<int32_t> at_least(const std::vector<float>& x, float t) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::fabs(x[i]) >= t && x[i] != 0.f) out.push_back(static_cast<int32_t>(i));
  return out;
}

// The exactly-k rule by a full sort on (|x| descending, index ascending).
std::vector<int32_t> exactly_k_by_sort(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

TEST_CASE("Threshold passes select exactly the entries at or above the bound, in index order", "[select]") {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{4097}, int64_t{300001}}) {
    const auto x = normal_vector(n, 1 + n);
    for (float lo : {0.f, 0.5f, 2.5f, 10.f}) {
      SparseList out;
      SelectScratch scratch;
      const int64_t count = select_at_least(read_only(x.data()), n, lo, out, scratch);
      std::vector<int32_t> expected;
      for (int64_t i = 0; i < n; ++i)
        if (std::fabs(x[i]) >= lo) expected.push_back(static_cast<int32_t>(i));
      REQUIRE(count == static_cast<int64_t>(expected.size()));
      CHECK(indices(out) == expected);
      for (int64_t j = 0; j < count; ++j) CHECK(out.value()[j] == x[out.index()[j]]);
    }
  }
}

TEST_CASE("The accumulating pass forms grad + residual, applies deferred clears and selects from the sum", "[select]") {
  const int64_t n = 200003;
  const auto grad = normal_vector(n, 11);
  auto residual = normal_vector(n, 12, 0.5f);
  std::vector<uint16_t> flags((n + 15) / 16, 0);
  std::mt19937_64 rng(13);
  std::vector<float> acc(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool cleared = rng() % 5 == 0 || i == n - 1;
    if (cleared) set_flag(flags.data(), i);
    acc[i] = grad[i] + (cleared ? 0.f : residual[i]);
  }
  SparseList out;
  SelectScratch scratch;
  const auto grad_before = grad;
  select_at_least(SelectSource{grad.data(), residual.data(), flags.data()}, n, 2.f, out, scratch);
  CHECK(residual == acc);
  CHECK(grad == grad_before);
  CHECK(std::all_of(flags.begin(), flags.end(), [](uint16_t f) { return f == 0; }));
  CHECK(indices(out) == at_least(acc, 2.f));
}

TEST_CASE("Selections do not depend on the thread count", "[select]") {
  const int64_t n = 500000;
  const auto x = normal_vector(n, 3);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<int32_t>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    SparseList out;
    SelectScratch scratch;
    auto res = x;
    auto g = normal_vector(n, 4);
    select_top_k(SelectSource{g.data(), res.data(), nullptr}, n, 5000, false, out, scratch);
    results.push_back(indices(out));
  }
  omp_set_num_threads(saved);
  CHECK(results[0] == results[1]);
  CHECK(results[0] == results[2]);
}

TEST_CASE("Exact k-th magnitude: small buffers and sampled large ones", "[select]") {
  for (int64_t n : {int64_t{10}, int64_t{1000}, int64_t{100000}, int64_t{2000000}}) {
    for (double density : {0.001, 0.02, 0.3}) {
      const int64_t k = top_k_count(density, n);
      auto grad = normal_vector(n, 100 + n);
      auto residual = normal_vector(n, 200 + n, 0.3f);
      std::vector<float> acc(n);
      for (int64_t i = 0; i < n; ++i) acc[i] = grad[i] + residual[i];
      SparseList out;
      SelectScratch scratch;
      const float t = select_top_k(SelectSource{grad.data(), residual.data(), nullptr}, n, k, false, out, scratch);
      INFO("n = " << n << ", k = " << k);
      CHECK(t == kth_by_sort(acc, k));
      CHECK(indices(out) == at_least(acc, t));
      // Read-only form on the accumulated buffer, exactly-k rule.
      SparseList exact;
      select_top_k(read_only(acc.data()), n, k, true, exact, scratch);
      CHECK(indices(exact) == exactly_k_by_sort(acc, k));
    }
  }
}

TEST_CASE("Heavy-tailed and clustered gradients still give the exact k-th magnitude", "[select]") {
  // Most entries tiny, a contiguous layer of large ones: the sample sees the layer only in a few
  // lines, so the bound may be off; the result must still be exact.
  const int64_t n = 3000000, k = 60000;
  auto x = normal_vector(n, 5, 1e-4f);
  std::mt19937_64 rng(6);
  std::cauchy_distribution<float> cauchy(0.f, 1.f);
  for (int64_t i = 1000000; i < 1100000; ++i) x[i] = cauchy(rng);
  SparseList out;
  SelectScratch scratch;
  const float t = select_top_k(read_only(x.data()), n, k, false, out, scratch);
  CHECK(t == kth_by_sort(x, k));
  CHECK(out.size() == k);
}

TEST_CASE("Ties: the threshold rule keeps them all, the exactly-k rule keeps lower indices", "[select]") {
  std::vector<float> x(100000, 0.f);
  for (int64_t i = 0; i < 100000; i += 10) x[i] = (i % 20 == 0) ? 1.f : -1.f;  // 10000 entries of magnitude 1
  x[77777] = 3.f;
  SparseList out;
  SelectScratch scratch;
  float t = select_top_k(read_only(x.data()), 100000, 100, false, out, scratch);
  CHECK(t == 1.f);
  CHECK(out.size() == 10001);
  select_top_k(read_only(x.data()), 100000, 100, true, out, scratch);
  CHECK(indices(out) == exactly_k_by_sort(x, 100));
  CHECK(out.size() == 100);
  CHECK(out.index()[0] == 0);
  CHECK(std::count(out.index(), out.index() + out.size(), 77777) == 1);
}

TEST_CASE("Zeros: never selected by a threshold, taken lowest index first when k needs them", "[select]") {
  std::vector<float> x(1000, 0.f);
  for (int i : {5, 500, 999}) x[i] = 0.25f * i;
  SparseList out;
  SelectScratch scratch;
  select_top_k(read_only(x.data()), 1000, 10, false, out, scratch);
  CHECK(indices(out) == std::vector<int32_t>{5, 500, 999});
  select_top_k(read_only(x.data()), 1000, 10, true, out, scratch);
  CHECK(indices(out) == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 500, 999});
}

TEST_CASE("Sorted-list sums equal dense sums in list order", "[select]") {
  const int64_t n = 5000;
  std::mt19937_64 rng(9);
  std::vector<SparseList> lists(5);
  std::vector<ListRef> refs;
  std::vector<float> dense(n, 0.f);
  std::vector<bool> touched(n, false);
  for (auto& l : lists) {
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < n; ++i)
      if (rng() % 7 == 0) idx.push_back(static_cast<int32_t>(i));
    l.resize(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) {
      l.index()[j] = idx[j];
      l.value()[j] = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 7.f;
      dense[idx[j]] = touched[idx[j]] ? dense[idx[j]] + l.value()[j] : l.value()[j];
      touched[idx[j]] = true;
    }
    refs.push_back({l.index(), l.value(), l.size()});
  }
  // Up to 5 lists take the one-pass merge; 20 lists (the same ones repeated) the pairwise one.
  for (int copy = 0; copy < 3; ++copy) refs.insert(refs.end(), refs.begin(), refs.begin() + 5);
  for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{17}, size_t{20}}) {
    std::vector<ListRef> some(refs.begin(), refs.begin() + count);
    std::vector<float> expect(n, 0.f);
    std::vector<bool> seen(n, false);
    for (const auto& r : some)
      for (int64_t j = 0; j < r.size; ++j) {
        expect[r.index[j]] = seen[r.index[j]] ? expect[r.index[j]] + r.value[j] : r.value[j];
        seen[r.index[j]] = true;
      }
    SparseList out, tmp;
    merge_sum_all(some, out, tmp);
    std::vector<int32_t> want;
    for (int64_t i = 0; i < n; ++i)
      if (seen[i]) want.push_back(static_cast<int32_t>(i));
    REQUIRE(indices(out) == want);
    for (int64_t j = 0; j < out.size(); ++j) CHECK(out.value()[j] == expect[out.index()[j]]);
  }
}

TEST_CASE("k, the threshold nudge and the normal quantile", "[select]") {
  CHECK(top_k_count(0.02, 27569568) == 551392);
  CHECK(top_k_count(0.01, 1000) == 10);
  CHECK(top_k_count(1e-9, 1000) == 1);
  CHECK(top_k_count(1.0, 7) == 7);
  CHECK(nudge_threshold(1.f, 74, 100) == 1.f / 1.012f);
  CHECK(nudge_threshold(1.f, 75, 100) == 1.f);
  CHECK(nudge_threshold(1.f, 125, 100) == 1.f);
  CHECK(nudge_threshold(1.f, 126, 100) == 1.f * 1.012f);
  CHECK(normal_two_sided_quantile(0.05) == Approx(1.959963985).epsilon(1e-9));
  CHECK(normal_two_sided_quantile(0.02) == Approx(2.326347874).epsilon(1e-9));
  CHECK(normal_two_sided_quantile(0.001) == Approx(3.290526731).epsilon(1e-9));
}

TEST_CASE("Error feedback: lazy zero residual, deferred clears, and a checked round trip", "[select]") {
  ErrorFeedback ef(1000);
  CHECK_FALSE(ef.allocated());
  std::stringstream empty;
  ef.save(empty);
  float* r = ef.residual();
  CHECK(std::all_of(r, r + 1000, [](float v) { return v == 0.f; }));
  for (int i = 0; i < 1000; ++i) r[i] = static_cast<float>(i);
  const int32_t some[] = {5, 7};
  ef.clear(some, 2);
  const int32_t more[] = {999};
  set_flag(ef.clear_flags(), more[0]);
  // Saved with the clears applied, before anything applied them to the buffer.
  std::stringstream saved;
  ef.save(saved);
  // An accumulating pass applies them: acc = grad + residual with cleared entries as zero.
  std::vector<float> grad(1000, 1.f);
  SparseList list;
  SelectScratch scratch;
  select_at_least(ef.accumulate(grad.data()), 1000, 1e9f, list, scratch);
  r = ef.residual();
  CHECK(r[5] == 1.f);
  CHECK(r[7] == 1.f);
  CHECK(r[999] == 1.f);
  CHECK(r[1] == 2.f);
  CHECK(r[900] == 901.f);
  ErrorFeedback back(1000);
  back.load(saved, "test");
  const float* b = back.residual();
  CHECK(b[5] == 0.f);
  CHECK(b[7] == 0.f);
  CHECK(b[999] == 0.f);
  CHECK(b[900] == 900.f);
  // residual() applies pending clears too.
  ef.clear(more, 1);
  CHECK(ef.residual()[999] == 0.f);
  ErrorFeedback none(1000);
  none.load(empty, "test");
  CHECK_FALSE(none.allocated());
  std::stringstream again;
  ef.save(again);
  ErrorFeedback wrong(999);
  CHECK_THROWS_WITH(wrong.load(again, "oktopk"), Catch::Matchers::Contains("1000") && Catch::Matchers::Contains("999"));
}

TEST_CASE("The dense output is written in one pass: values / divisor at the indices, zeros elsewhere", "[select]") {
  std::mt19937_64 rng(21);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3})
    for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
      omp_set_num_threads(threads);
      // Three runs over ascending index ranges, as oktopk's per-rank blocks.
      std::vector<std::vector<int32_t>> idx(3);
      std::vector<std::vector<float>> val(3);
      std::vector<float> want(n, 0.f);
      std::vector<char> in_output(n, 0);
      for (int64_t i = 0; i < n; ++i)
        if (rng() % 9 == 0 || i == n - 1) {
          in_output[i] = 1;
          const int run = static_cast<int>(3 * i / n);
          idx[run].push_back(static_cast<int32_t>(i));
          val[run].push_back(static_cast<float>(static_cast<int>(rng() % 1000)) - 500.f);
          want[i] = val[run].back() / 3.f;
        }
      std::vector<ListRef> runs;
      for (int r = 0; r < 3; ++r) runs.push_back({idx[r].data(), val[r].data(), static_cast<int64_t>(idx[r].size())});
      OutputScratch scratch;
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {  // 64-byte aligned (non-temporal stores) and not
        float* buffer = static_cast<float*>(std::aligned_alloc(64, ((n + 16) * sizeof(float) + 63) / 64 * 64));
        std::fill(buffer, buffer + n + 16, 7.f);
        // This rank's own selection: some entries of the output and some others.
        std::vector<uint16_t> mine((n + 15) / 16, 0), clear((n + 15) / 16, 0), want_clear((n + 15) / 16, 0);
        int64_t want_common = 0;
        for (int64_t i = 0; i < n; ++i)
          if (rng() % 3 == 0) {
            set_flag(mine.data(), i);
            if (in_output[i]) set_flag(want_clear.data(), i), ++want_common;
          }
        const int64_t common = write_sparse_output(buffer + offset, n, runs, 3.f, scratch, mine.data(), clear.data());
        INFO("n = " << n << ", threads " << threads << ", offset " << offset);
        CHECK(std::equal(want.begin(), want.end(), buffer + offset));
        CHECK(buffer[n + offset] == 7.f);
        CHECK(common == want_common);
        CHECK(clear == want_clear);
        CHECK(std::all_of(mine.begin(), mine.end(), [](uint16_t f) { return f == 0; }));
        std::free(buffer);
      }
      CHECK(std::all_of(scratch.bits.begin(), scratch.bits.end(), [](uint16_t f) { return f == 0; }));
    }
  omp_set_num_threads(saved);
}

// ---- The instruction sets (comm/sync/methods/sparse/select_kernels.h): every version against the scalar one, bit
// for bit, in one process.

namespace {

// Forces one instruction set for the selection kernels while in scope.
struct ForcedIsa {
  explicit ForcedIsa(const std::string& isa) {
    REQUIRE(set_selection_isa_for_testing(isa));
    REQUIRE(selection_isa() == isa);
  }
  ~ForcedIsa() { set_selection_isa_for_testing(""); }
};

// Normal values with, now and then, the values a comparison or an add treats specially: zeros of
// both signs, the smallest denormal, exact ties with the bounds the tests use, infinities and
// (optionally) NaN.
std::vector<float> awkward_vector(int64_t n, uint64_t seed, float scale, bool with_nan) {
  auto v = normal_vector(n, seed, scale);
  const float inf = std::numeric_limits<float>::infinity(), tiny = std::numeric_limits<float>::denorm_min();
  const float specials[] = {0.f,  -0.f, tiny, -tiny, 1.f,
                            -1.f, 2.5f, inf,  -inf,  std::numeric_limits<float>::quiet_NaN()};
  std::mt19937_64 rng(seed + 1000);
  for (auto& x : v)
    if (rng() % 16 == 0) x = specials[rng() % (with_nan ? 10 : 9)];
  return v;
}

// The first position where two arrays differ bitwise (-1: none), so a failure names one entry
// rather than printing both arrays; arrays of different sizes differ at the shorter size.
template <class T>
int64_t first_difference(const T* a, int64_t na, const T* b, int64_t nb) {
  for (int64_t i = 0; i < std::min(na, nb); ++i)
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return i;
  return na == nb ? -1 : std::min(na, nb);
}
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  return first_difference(a.data(), static_cast<int64_t>(a.size()), b.data(), static_cast<int64_t>(b.size()));
}

// Everything a selection writes: the list, the threshold, the residual and the flags.
struct SelectionResult {
  float t = 0.f;
  std::vector<int32_t> index;
  std::vector<float> value, residual;
  std::vector<uint16_t> flags;
};

void require_same(const SelectionResult& got, const SelectionResult& want) {
  CHECK(std::memcmp(&got.t, &want.t, sizeof(float)) == 0);
  CHECK(first_difference(got.index, want.index) == -1);
  CHECK(first_difference(got.value, want.value) == -1);
  CHECK(first_difference(got.residual, want.residual) == -1);
  CHECK(first_difference(got.flags, want.flags) == -1);
}

enum class Source { plain, accumulate, accumulate_with_clears };

// One selection on fresh copies of the inputs: select_at_least(lo) when k = 0, else select_top_k.
SelectionResult run_selection(Source source, const std::vector<float>& grad, const std::vector<float>& residual0,
                              const std::vector<uint16_t>& flags0, float lo, int64_t k, bool exactly_k) {
  const int64_t n = static_cast<int64_t>(grad.size());
  SelectionResult r;
  r.residual = residual0;
  r.flags = flags0;
  SelectSource src = read_only(grad.data());
  if (source != Source::plain) src.residual = r.residual.data();
  if (source == Source::accumulate_with_clears) src.clear_bits = r.flags.data();
  SparseList out;
  SelectScratch scratch;
  if (k == 0) {
    const int64_t count = select_at_least(src, n, lo, out, scratch);
    CHECK(count == out.size());
  } else {
    r.t = select_top_k(src, n, k, exactly_k, out, scratch);
  }
  r.index.assign(out.index(), out.index() + out.size());
  r.value.assign(out.value(), out.value() + out.size());
  return r;
}

}  // namespace

TEST_CASE("The instruction sets this CPU runs are found and can be forced", "[select][simd]") {
  const auto isas = selection_isas_supported();
  REQUIRE(!isas.empty());
  CHECK(isas[0] == "scalar");
#if defined(__x86_64__)
  // Checked against the compiler's own CPU test, so a dispatch that silently fell back to scalar
  // (and left the comparisons below nothing to compare) fails here.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2"), avx512 = __builtin_cpu_supports("avx512f");
  CHECK(std::count(isas.begin(), isas.end(), "avx2") == (avx2 ? 1 : 0));
  CHECK(std::count(isas.begin(), isas.end(), "avx512") == (avx512 ? 1 : 0));
#endif
  const std::string before = selection_isa();
  CHECK(std::count(isas.begin(), isas.end(), before) == 1);
  CHECK_FALSE(set_selection_isa_for_testing("sse9"));
  CHECK(selection_isa() == before);
  for (const auto& isa : isas) {
    ForcedIsa forced(isa);
    CHECK(selection_isa() == isa);
  }
  CHECK(selection_isa() == before);
}

TEST_CASE("Every instruction set selects, accumulates and clears bit for bit as the scalar path", "[select][simd]") {
  const int saved = omp_get_max_threads();
  const float inf = std::numeric_limits<float>::infinity();
  // Sizes around the 16-entry words and 4096-entry blocks, and above the 2^16 where threads start.
  for (int64_t n :
       {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{23}, int64_t{4096 + 9}, int64_t{70001}, int64_t{300007}}) {
    const auto grad = awkward_vector(n, 30 + n, 1.f, true);
    const auto residual = awkward_vector(n, 40 + n, 0.7f, true);
    std::vector<uint16_t> flags((n + 15) / 16, 0);
    std::mt19937_64 rng(50 + n);
    for (int64_t i = 0; i < n; ++i)
      if (rng() % 3 == 0 || i == n - 1) set_flag(flags.data(), i);
    for (int threads : {1, 2, 3})
      for (Source source : {Source::plain, Source::accumulate, Source::accumulate_with_clears})
        for (float lo : {0.f, std::numeric_limits<float>::denorm_min(), 1.f, 2.5f, inf}) {
          omp_set_num_threads(threads);
          SelectionResult want;
          {
            ForcedIsa forced("scalar");
            want = run_selection(source, grad, residual, flags, lo, 0, false);
          }
          for (const auto& isa : selection_isas_supported()) {
            ForcedIsa forced(isa);
            INFO(isa << ": n = " << n << ", threads " << threads << ", source " << static_cast<int>(source)
                     << ", lo = " << lo);
            require_same(run_selection(source, grad, residual, flags, lo, 0, false), want);
          }
        }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("Every instruction set gives the scalar path's exact top-k", "[select][simd]") {
  const int saved = omp_get_max_threads();
  for (int64_t n : {int64_t{1001}, int64_t{70001}, int64_t{300007}}) {
    // No NaN here: the sampled bound's nth_element needs ordered values.
    const auto grad = awkward_vector(n, 60 + n, 1.f, false);
    const auto residual = awkward_vector(n, 70 + n, 0.5f, false);
    std::vector<uint16_t> flags((n + 15) / 16, 0);
    std::mt19937_64 rng(80 + n);
    for (int64_t i = 0; i < n; ++i)
      if (rng() % 7 == 0) set_flag(flags.data(), i);
    for (int threads : {1, 3})
      for (Source source : {Source::plain, Source::accumulate, Source::accumulate_with_clears})
        for (double density : {0.02, 0.3})
          for (bool exactly_k : {false, true}) {
            omp_set_num_threads(threads);
            const int64_t k = top_k_count(density, n);
            SelectionResult want;
            {
              ForcedIsa forced("scalar");
              want = run_selection(source, grad, residual, flags, 0.f, k, exactly_k);
            }
            REQUIRE(static_cast<int64_t>(want.index.size()) >= k);
            for (const auto& isa : selection_isas_supported()) {
              ForcedIsa forced(isa);
              INFO(isa << ": n = " << n << ", threads " << threads << ", source " << static_cast<int>(source)
                       << ", k = " << k << (exactly_k ? " exactly" : ""));
              require_same(run_selection(source, grad, residual, flags, 0.f, k, exactly_k), want);
            }
          }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("Every instruction set writes the scalar path's dense output and clears", "[select][simd]") {
  const int saved = omp_get_max_threads();
  std::mt19937_64 rng(90);
  const float specials[] = {-0.f, 0.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (int threads : {1, 3})
    for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1000}, int64_t{4099}, int64_t{100003}})
      for (uint64_t one_in : {uint64_t{1}, uint64_t{2}, uint64_t{9}, uint64_t{1} << 40}) {  // all ... almost none
        omp_set_num_threads(threads);
        // Three runs over ascending index ranges, as oktopk's per-rank blocks; some values special.
        std::vector<std::vector<int32_t>> idx(3);
        std::vector<std::vector<float>> val(3);
        for (int64_t i = 0; i < n; ++i)
          if (rng() % one_in == 0 || i == n - 1) {
            const int run = static_cast<int>(3 * i / n);
            idx[run].push_back(static_cast<int32_t>(i));
            val[run].push_back(rng() % 8 == 0 ? specials[rng() % 4] : static_cast<float>(rng() % 1000) - 500.f);
          }
        std::vector<ListRef> runs;
        for (int r = 0; r < 3; ++r) runs.push_back({idx[r].data(), val[r].data(), static_cast<int64_t>(idx[r].size())});
        std::vector<uint16_t> mine0((n + 15) / 16, 0), clear0((n + 15) / 16, 0);
        for (int64_t i = 0; i < n; ++i) {
          if (rng() % 3 == 0) set_flag(mine0.data(), i);
          if (rng() % 5 == 0) set_flag(clear0.data(), i);
        }
        // 64-byte aligned (non-temporal stores), 32-byte aligned only, and not aligned.
        for (int64_t offset : {int64_t{0}, int64_t{8}, int64_t{1}})
          for (bool with_mine : {false, true}) {
            struct Output {
              std::vector<float> dst;
              std::vector<uint16_t> mine, clear;
              int64_t common;
            };
            auto write = [&] {
              Output o{{}, mine0, clear0, 0};
              float* buffer = static_cast<float*>(std::aligned_alloc(64, ((n + 32) * sizeof(float) + 63) / 64 * 64));
              std::fill(buffer, buffer + n + 32, 7.f);
              OutputScratch scratch;
              o.common = write_sparse_output(buffer + offset, n, runs, 3.f, scratch,
                                             with_mine ? o.mine.data() : nullptr, with_mine ? o.clear.data() : nullptr);
              o.dst.assign(buffer, buffer + n + 32);  // with the untouched floats around it
              std::free(buffer);
              CHECK(std::all_of(scratch.bits.begin(), scratch.bits.end(), [](uint16_t f) { return f == 0; }));
              return o;
            };
            Output want;
            {
              ForcedIsa forced("scalar");
              want = write();
            }
            for (const auto& isa : selection_isas_supported()) {
              ForcedIsa forced(isa);
              INFO(isa << ": n = " << n << ", threads " << threads << ", one in " << one_in << ", offset " << offset
                       << (with_mine ? ", with this rank's flags" : ""));
              const Output got = write();
              CHECK(first_difference(got.dst, want.dst) == -1);
              CHECK(got.common == want.common);
              CHECK(first_difference(got.mine, want.mine) == -1);
              CHECK(first_difference(got.clear, want.clear) == -1);
            }
          }
      }
  omp_set_num_threads(saved);
}
