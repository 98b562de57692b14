#include "trainer/tools/bench_bound.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "models/cpu/dnnl_matmul.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

double gemm_gflops(bool bf16) {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = Clock::now();
    if (bf16)
      models::cpu::bf16_gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    else
      dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    if (i > 0) best = std::min(best, seconds_since(t0));  // the first call warms up
  }
  return 2.0 * n * n * n / best / 1e9;
}

double read_gbps(int64_t bytes) {
  // Sums in 64 independent lanes, so that the adds' latency never limits the reads; every pass of
  // a round runs in one parallel region (no barrier, no wake-up between passes: a GEMM's threads
  // stay up across its time steps the same way).
  constexpr int64_t kLanes = 64;
  const int64_t n = std::max<int64_t>(bytes / 4 / kLanes, 1) * kLanes;
  std::vector<float> buffer(n, 1.f);
  const int64_t passes = std::max<int64_t>(1, (int64_t(256) << 20) / (n * 4));
  double best = 0, total = 0;
  for (int round = 0; round < 6; ++round) {
    float sums[kLanes] = {};
    const auto t0 = Clock::now();
#pragma omp parallel
    {
      float lane[kLanes] = {};
      for (int64_t p = 0; p < passes; ++p) {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < n; i += kLanes)
          for (int64_t j = 0; j < kLanes; ++j) lane[j] += buffer[i + j];
      }
#pragma omp critical
      for (int64_t j = 0; j < kLanes; ++j) sums[j] += lane[j];
    }
    const double gbps = passes * n * 4.0 / seconds_since(t0) / 1e9;
    for (float s : sums) total += s;
    if (round > 0) best = std::max(best, gbps);  // the first round pages the buffer in
  }
  // The sums are used, so the reads cannot be optimized away.
  return total > 0 ? best : 0;
}

StepBound step_bound(const std::vector<models::StreamedWeights>& streamed, int element_bytes, double step_gflop,
                     double peak_gflops) {
  StepBound b;
  std::map<int64_t, double> bandwidth;  // GB/s by working set bytes: one probe per size
  for (const models::StreamedWeights& w : streamed) {
    const int64_t set = w.working_set * element_bytes;
    auto it = bandwidth.find(set);
    if (it == bandwidth.end()) it = bandwidth.emplace(set, read_gbps(set)).first;
    const double bytes = w.reads * element_bytes;
    b.streamed_bytes += bytes;
    b.streamed_ms += bytes / (it->second * 1e9) * 1e3;
    b.streamed_gflop += 2.0 * w.rows * w.reads / 1e9;
  }
  b.read_gbps = b.streamed_ms > 0 ? b.streamed_bytes / (b.streamed_ms / 1e3) / 1e9 : 0;
  b.rest_gflop = std::max(0.0, step_gflop - b.streamed_gflop);
  b.rest_ms = b.rest_gflop / peak_gflops * 1e3;
  b.ms = b.streamed_ms + b.rest_ms;
  return b;
}

}  // namespace trainer::app
