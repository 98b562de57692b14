#include "trainer/tools/bench_outer.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"

namespace trainer::comm {

namespace {

constexpr int kWarmupSteps = 2;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
}

}  // namespace

int run_outer_bench(int64_t n, int steps) {
  Communicator& comm = world();
  const int rank = comm.rank(), p = comm.size();
  if (n < 1 || steps < 1) {
    if (rank == 0) std::fprintf(stderr, "bench outer: n and steps must be positive\n");
    return 2;
  }
  // A pseudo-gradient's look: normal values at magnitudes that change from block to block.
  std::vector<float> input(static_cast<size_t>(n));
  std::mt19937 rng(17 + rank);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) input[i] = normal(rng) * std::pow(10.f, static_cast<float>((i / 4096) % 5) - 4.f);
  std::vector<float> data(input.size());

  const std::vector<std::string>& names = outer_dtype_names();
  const size_t formats = names.size();
  std::vector<std::vector<double>> total_ms(formats, std::vector<double>(steps)), comm_ms = total_ms;
  QuantizedScratch scratch;
  CommLogOptions on;
  on.enabled = true;  // statistics only (no file): the calls' own time
  for (int s = 0; s < kWarmupSteps + steps; ++s) {
    for (size_t f = 0; f < formats; ++f) {
      std::copy(input.begin(), input.end(), data.begin());
      comm.log().open(on, rank, p);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      allreduce_sum_quantized(comm, data.data(), n, static_cast<OuterDType>(f), scratch, "ALLREDUCE_OUTER");
      const double t1 = MPI_Wtime();
      int64_t call_us = 0;
      for (const auto& op : comm.log().op_stats()) call_us += op.time_us;
      if (s >= kWarmupSteps) {
        total_ms[f][s - kWarmupSteps] = (t1 - t0) * 1e3;
        comm_ms[f][s - kWarmupSteps] = call_us * 1e-3;
      }
    }
  }
  comm.log().open(CommLogOptions{}, rank, p);

  // A step lasts as long as its slowest rank; the split is the slowest rank's too, per step.
  std::vector<double> ms(formats), in_calls(formats);
  for (size_t f = 0; f < formats; ++f) {
    MPI_Allreduce(MPI_IN_PLACE, total_ms[f].data(), steps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, comm_ms[f].data(), steps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    ms[f] = median(total_ms[f]);
    in_calls[f] = median(comm_ms[f]);
  }
  if (rank != 0) return 0;

  const double mb = static_cast<double>(n) * 4 / 1e6;
  std::printf("outer bench: n = %lld floats (%.1f MB fp32), P = %d, median of %d steps (slowest rank), %d warmup\n",
              static_cast<long long>(n), mb, p, steps, kWarmupSteps);
  std::printf("%-6s %10s %10s %12s %12s %14s %9s\n", "format", "ms/call", "ms/MB", "in calls ms", "local ms",
              "bytes sent", "vs fp32");
  nlohmann::json j = {{"bench", "outer"}, {"n", n}, {"world", p}, {"steps", steps}};
  for (size_t f = 0; f < formats; ++f) {
    const QuantizedVolume v = quantized_volume(static_cast<OuterDType>(f), n, p);
    const double sent_ratio = static_cast<double>(v.bytes_sent) / static_cast<double>(4 * n);
    std::printf("%-6s %10.3f %10.4f %12.3f %12.3f %14lld %8.3fx\n", names[f].c_str(), ms[f], ms[f] / mb, in_calls[f],
                ms[f] - in_calls[f], static_cast<long long>(v.bytes_sent), sent_ratio);
    j["ms"][names[f]] = ms[f];
    j["ms_in_calls"][names[f]] = in_calls[f];
    j["bytes_sent"][names[f]] = v.bytes_sent;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace trainer::comm
