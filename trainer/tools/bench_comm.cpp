#include "trainer/tools/bench_comm.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/sync/gradient_sync.h"
#include "comm/communicator.h"

namespace trainer::comm {

namespace {

constexpr int kWarmupSteps = 2;
constexpr int64_t kMpiPiece = int64_t(1) << 28;

// One way of syncing the buffer. `log` says how the world's log must be set up while it runs.
struct BenchCase {
  std::string key;    // JSON name
  std::string label;  // table row
  bool log = false;
  std::function<void(int64_t step)> step;
};

void scale(float* x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
}

}  // namespace

int run_comm_bench(int64_t n, int steps, double bucket_mb) {
  Communicator& comm = world();
  const int rank = comm.rank(), p = comm.size();
  if (n < 1 || steps < 1 || bucket_mb <= 0) {
    if (rank == 0) std::fprintf(stderr, "bench comm: n, steps and bucket_mb must be positive\n");
    return 2;
  }
  std::vector<float> grad(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) grad[i] = static_cast<float>((i % 1000) * 1e-3 + rank);
  float* g = grad.data();
  const float inv_p = 1.0f / static_cast<float>(p);

  // One file per rank in the temp folder; it is removed at the end.
  const std::string log_name =
      "trainer_bench_comm_" + std::to_string(getpid()) + "_rank" + std::to_string(rank) + ".jsonl";
  const std::string log_path = (std::filesystem::temp_directory_path() / log_name).string();
  CommLogOptions on;
  on.enabled = true;
  on.path = log_path;
  on.append = true;  // reopened for every logged case of every step
  const CommLogOptions off;

  char bucket_label[64];
  std::snprintf(bucket_label, sizeof bucket_label, "(e) DenseSync, %g MB buckets, log on", bucket_mb);
  // The gradient-sync stage itself (comm/sync/methods/dense/dense.h), as the trainer runs it: with the whole
  // buffer as one bucket (the same message as (a)), and with the configured bucket size.
  const auto dense = [](double bucket_mb) {
    SyncOptions o;
    o.bucket_mb = bucket_mb;
    return o;
  };
  auto whole = make_gradient_sync(dense(static_cast<double>(n) * 4 / 1e6 + 1), comm, n);
  auto bucketed = make_gradient_sync(dense(bucket_mb), comm, n);
  SyncBuffers buffers{nullptr, g, n, nullptr, 0, nullptr};
  std::vector<BenchCase> cases = {
      {"mpi", "(a) bare MPI_Allreduce + scale", false,
       [&](int64_t) {
         // Pieces of 2^28 floats keep int counts, as the communicator does; the default n is one.
         for (int64_t off = 0; off < n; off += kMpiPiece) {
           const int c = static_cast<int>(std::min(kMpiPiece, n - off));
           MPI_Allreduce(MPI_IN_PLACE, g + off, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         }
         scale(g, n, inv_p);
       }},
      {"comm", "(b) Communicator, log disabled", false,
       [&](int64_t step) {
         comm.log().set_step(step, Phase::kDense);
         comm.allreduce(g, n, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
         scale(g, n, inv_p);
       }},
      {"comm_log", "(c) Communicator, log enabled", true,
       [&](int64_t step) {
         comm.log().set_step(step, Phase::kDense);
         comm.allreduce(g, n, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
         scale(g, n, inv_p);
       }},
      {"dense_sync", "(d) DenseSync, one bucket, log enabled", true,
       [&](int64_t step) { whole->reduce(buffers, step); }},
      {"dense_sync_buckets", bucket_label, true, [&](int64_t step) { bucketed->reduce(buffers, step); }},
  };

  // times[c][s]: this rank's time of case c at timed step s.
  std::vector<std::vector<double>> times(cases.size(), std::vector<double>(static_cast<size_t>(steps)));
  bool log_on = false;
  comm.log().open(off, rank, p);
  for (int s = 0; s < kWarmupSteps + steps; ++s) {
    for (size_t c = 0; c < cases.size(); ++c) {
      if (cases[c].log != log_on) {
        comm.log().open(cases[c].log ? on : off, rank, p);
        log_on = cases[c].log;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      cases[c].step(s);
      const double t1 = MPI_Wtime();
      if (s >= kWarmupSteps) times[c][s - kWarmupSteps] = (t1 - t0) * 1e3;
    }
  }
  comm.log().open(off, rank, p);
  std::error_code ec;
  const auto log_bytes = std::filesystem::file_size(log_path, ec);
  std::filesystem::remove(log_path, ec);

  // A step lasts as long as its slowest rank.
  std::vector<double> ms(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    MPI_Allreduce(MPI_IN_PLACE, times[c].data(), steps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    ms[c] = median(times[c]);
  }
  if (rank != 0) return 0;

  std::printf("comm bench: n = %lld floats (%.1f MB), P = %d, median of %d steps (slowest rank), %d warmup\n",
              static_cast<long long>(n), n * 4 / 1e6, p, steps, kWarmupSteps);
  std::printf("%-40s %10s %9s\n", "case", "ms/step", "vs (a)");
  nlohmann::json j = {{"bench", "comm"}, {"n", n},     {"world", p},
                      {"steps", steps},  {"bucket_mb", bucket_mb}, {"log_file_bytes", log_bytes}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const double overhead = ms[0] > 0 ? 100.0 * (ms[c] / ms[0] - 1.0) : 0.0;
    // Microsecond resolution for small messages.
    const int digits = ms[c] < 1.0 ? 4 : 3;
    if (c == 0) {
      std::printf("%-40s %10.*f %9s\n", cases[c].label.c_str(), digits, ms[c], "-");
    } else {
      std::printf("%-40s %10.*f %+8.1f%%\n", cases[c].label.c_str(), digits, ms[c], overhead);
      j["overhead_pct"][cases[c].key] = overhead;
    }
    j["ms"][cases[c].key] = ms[c];
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace trainer::comm
