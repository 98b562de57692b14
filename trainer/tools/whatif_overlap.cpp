#include "trainer/tools/whatif_overlap.h"

#include <algorithm>

namespace trainer::app {
namespace {

// Microseconds of the union of [t0, t1) intervals clipped to start at `from`.
int64_t covered_after(std::vector<std::pair<int64_t, int64_t>> intervals, int64_t from) {
  std::sort(intervals.begin(), intervals.end());
  int64_t end = from, covered = 0;
  for (const auto& [a, b] : intervals) {
    const int64_t start = std::max(a, end);
    if (b > start) covered += b - start;
    end = std::max(end, b);
  }
  return covered;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

OverlapMeasurement OverlapLog::measure() const {
  OverlapMeasurement m;
  std::vector<double> backward, exposed, waits;
  std::vector<std::vector<double>> ready, size;  // per bucket index, over steps
  for (const auto& [step, s] : steps_) {
    const auto [c0, c1] = s.compute;
    if (c0 < 0) continue;
    backward.push_back(static_cast<double>(c1 - c0) / 1e3);
    std::vector<std::pair<int64_t, int64_t>> intervals;
    int64_t wait = 0;
    size_t k = 0;
    for (const Call& c : s.calls) {
      intervals.emplace_back(c.t0, c.t1);
      if (c.t0 >= c1) wait += c.wait;
      if (c.ready < 0) continue;
      if (ready.size() <= k) ready.resize(k + 1), size.resize(k + 1);
      ready[k].push_back(static_cast<double>(c.ready - c0) / 1e3);
      size[k].push_back(c.size);
      ++k;
    }
    exposed.push_back(static_cast<double>(covered_after(intervals, c1)) / 1e3);
    waits.push_back(static_cast<double>(wait) / 1e3);
  }
  m.backward_ms = median(backward);
  m.exposed_ms = median(exposed);
  m.wait_after_ms = median(waits);
  // Buckets every step had (a step whose log window cut it short has fewer).
  for (size_t k = 0; k < ready.size(); ++k)
    if (ready[k].size() * 2 > backward.size()) m.buckets.push_back({median(ready[k]), median(size[k])});
  return m;
}

double exposed_bucket_seconds(const OverlapMeasurement& overlap, const comm::NetworkRates& rates, int ranks) {
  double end = 0;
  for (const OverlappedBucket& b : overlap.buckets)
    end = std::max(end, b.ready_ms / 1e3) + rates.allreduce_seconds(b.size, ranks);
  return std::max(0.0, end - overlap.backward_ms / 1e3);
}

}  // namespace trainer::app
