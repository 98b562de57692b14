#include "comm/calibrate.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "models/cpu/dnnl_dispatch.h"

namespace trainer::comm {

namespace {

// Enough back-to-back calls per sample that the barrier's release skew between ranks (about one
// message latency), the clock's resolution and a rank losing its core for a scheduler slice (a few
// ms on a loaded machine) are small beside the sample, or at least do not hit most samples.
// At most 100 calls: on the loaded 2-core VM a small message's round trip sometimes took a whole
// scheduler tick (4 ms) right after probes that took 15 us, and 660 calls made one sample 2.6 s.
constexpr double kMinSampleSeconds = 10e-3;
constexpr int kMaxCallsPerSample = 100;
constexpr int kProbeCalls = 3;
constexpr int kChannel = 7;  // the ring shift's message stream (any; nothing else runs beside it)

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One size of one kind: a warm-up call (connections, buffers), then kProbeCalls calls timed one by
// one, whose fastest sets how many calls a sample times (the fastest, so that one call delayed by
// the scheduler does not shrink every sample to one call), then `repeats` samples, each the mean of
// back-to-back calls after a barrier. Every rank times itself; the slowest rank's time is the
// call's (a collective ends for the job when its last rank leaves it).
template <class Call>
CalibrationSize time_size(Communicator& comm, double bytes, int repeats, Call call) {
  CalibrationSize s;
  s.bytes = bytes;
  call();  // the first call of a size may open connections (Open MPI's TCP connects lazily)
  comm.barrier("CALIBRATE_BARRIER");
  double fastest = 1e30;
  for (int i = 0; i < kProbeCalls; ++i) {
    const double t0 = now_seconds();
    call();
    fastest = std::min(fastest, now_seconds() - t0);
  }
  comm.allreduce(&fastest, 1, DType::kF64, ReduceOp::kMax, "CALIBRATE_MAX");
  s.calls_per_sample = static_cast<int>(std::clamp(std::ceil(kMinSampleSeconds / std::max(fastest, 1e-9)), 1.0,
                                                   static_cast<double>(kMaxCallsPerSample)));
  s.samples_s.resize(static_cast<size_t>(repeats));
  for (double& sample : s.samples_s) {
    comm.barrier("CALIBRATE_BARRIER");
    const double t0 = now_seconds();
    for (int i = 0; i < s.calls_per_sample; ++i) call();
    sample = (now_seconds() - t0) / s.calls_per_sample;
  }
  comm.allreduce(s.samples_s.data(), repeats, DType::kF64, ReduceOp::kMax, "CALIBRATE_MAX");
  s.median_s = median(s.samples_s);
  return s;
}

// Sizes from min_bytes by size_factor while the previous median call took at most max_call_seconds.
// The stop depends only on reduced (equal) times, so every rank measures the same sizes.
template <class Measure>
std::vector<CalibrationSize> sweep(const CalibrateOptions& o, Measure measure) {
  std::vector<CalibrationSize> out;
  for (double bytes = o.min_bytes; bytes <= o.max_bytes * (1 + 1e-9); bytes *= o.size_factor) {
    out.push_back(measure(std::round(bytes)));
    if (out.back().median_s > o.max_call_seconds) break;
  }
  return out;
}

std::vector<SizeSample> medians(const std::vector<CalibrationSize>& sizes) {
  std::vector<SizeSample> out;
  for (const CalibrationSize& s : sizes) out.push_back({s.bytes, s.median_s});
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, static_cast<size_t>(std::max(length, 0)));
  const size_t end = text.find_first_of(",\n");
  return text.substr(0, end);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<std::string> host_names(Communicator& comm) {
  constexpr int kName = 128;
  char mine[kName] = {0};
  gethostname(mine, kName - 1);
  std::vector<char> all(static_cast<size_t>(kName) * comm.size());
  comm.allgather(mine, kName, all.data(), DType::kU8, "CALIBRATE_HOSTS");
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * kName);
  return out;
}

void check_options(const CalibrateOptions& o, int ranks) {
  if (ranks < 2)
    throw std::invalid_argument("trainer calibrate needs at least 2 ranks: run it under mpiexec -n P (inside "
                                "scripts/netem for an emulated network)");
  if (!(o.min_bytes >= 4) || !(o.max_bytes >= o.min_bytes))
    throw std::invalid_argument("trainer calibrate: sizes must satisfy 4 <= --min-bytes <= --max-bytes");
  if (!(o.size_factor > 1)) throw std::invalid_argument("trainer calibrate: --size-factor must be above 1");
  if (o.repeats < 1) throw std::invalid_argument("trainer calibrate: --repeats must be at least 1");
  if (!(o.max_call_seconds > 0)) throw std::invalid_argument("trainer calibrate: --max-call-seconds must be positive");
}

}  // namespace

NetworkCalibration measure_network(Communicator& comm, const CalibrateOptions& o) {
  check_options(o, comm.size());
  const int p = comm.size(), right = (comm.rank() + 1) % p, left = (comm.rank() + p - 1) % p;
  NetworkCalibration c;
  c.nominal_bandwidth = o.nominal.empty() ? 0 : parse_bandwidth(o.nominal);  // a bad unit before any traffic
  c.ranks = p;
  c.hosts = host_names(comm);
  c.cpu = cpu_model();
  c.isa = models::cpu::dnnl_isa_name();
  c.mpi = mpi_library();
  c.date = utc_now();
  c.repeats = o.repeats;

  // Buffers grow with the sweep (it stops early on a slow network). Zeros: sums stay finite.
  std::vector<float> data;
  std::vector<char> send, recv;
  // Allreduce: floats summed in place, dense sync's call.
  c.allreduce = sweep(o, [&](double bytes) {
    const int64_t count = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4));
    if (data.size() < static_cast<size_t>(count)) data.resize(static_cast<size_t>(count), 0.0f);
    return time_size(comm, static_cast<double>(count * 4), o.repeats, [&] {
      comm.allreduce(data.data(), count, DType::kF32, ReduceOp::kSum, "CALIBRATE_ALLREDUCE");
    });
  });
  // Point to point: a ring shift, each rank sending to the next and receiving from the previous at
  // once (P = 2: an exchange), so every link carries S each way as the sparse methods' messages do.
  c.p2p = sweep(o, [&](double bytes) {
    const int64_t count = static_cast<int64_t>(bytes);
    if (send.size() < static_cast<size_t>(count)) {
      send.resize(static_cast<size_t>(count), 0);
      recv.resize(static_cast<size_t>(count));
    }
    return time_size(comm, bytes, o.repeats, [&] {
      std::vector<Request> requests{comm.irecv(recv.data(), count, DType::kU8, left, kChannel, "CALIBRATE_RECV"),
                                    comm.isend(send.data(), count, DType::kU8, right, kChannel, "CALIBRATE_SEND")};
      comm.wait_all(requests);
    });
  });
  c.allreduce_fit = fit_network(OpKind::kAllreduce, p, medians(c.allreduce));
  c.p2p_fit = fit_network(OpKind::kPointToPoint, p, medians(c.p2p));
  return c;
}

std::string calibration_table(const NetworkCalibration& c) {
  std::string out;
  char line[256];
  std::string hosts;
  for (const std::string& h : c.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  std::snprintf(line, sizeof line, "calibrate: P = %d (%s), %s, %s\n", c.ranks, hosts.c_str(), c.mpi.c_str(),
                c.date.c_str());
  out += line;
  std::snprintf(line, sizeof line, "median of %d repeats (slowest rank); allreduce: floats summed in place; p2p: "
                "ring shift, every rank sends and receives S at once\n", c.repeats);
  out += line;
  std::snprintf(line, sizeof line, "%-9s %10s %6s %11s %11s %8s %14s\n", "kind", "bytes", "calls", "median ms",
                "fit ms", "fit err", "achieved");
  out += line;
  auto rows = [&](const char* kind, OpKind op, const std::vector<CalibrationSize>& sizes, const AlphaBetaFit& fit) {
    for (const CalibrationSize& s : sizes) {
      const double model = collective_seconds(op, s.bytes, c.ranks, fit.network);
      // Allreduce: nccl-tests' bus rate (S/t x 2(P-1)/P), the model's B; messages: S/t.
      const double bus = op == OpKind::kAllreduce ? 2.0 * (c.ranks - 1) / c.ranks : 1.0;
      std::snprintf(line, sizeof line, "%-9s %10.0f %6d %11.4f %11.4f %+7.1f%% %14s\n", kind, s.bytes,
                    s.calls_per_sample, s.median_s * 1e3, model * 1e3, 100 * (model - s.median_s) / s.median_s,
                    format_rate(s.bytes / s.median_s * bus).c_str());
      out += line;
    }
  };
  rows("allreduce", OpKind::kAllreduce, c.allreduce, c.allreduce_fit);
  rows("p2p", OpKind::kPointToPoint, c.p2p, c.p2p_fit);
  std::snprintf(line, sizeof line,
                "fit allreduce: latency %.1f us, bus rate %s (%.4g MB/s); worst size off by %.1f%%\n",
                c.allreduce_fit.network.latency * 1e6, format_rate(c.allreduce_fit.network.bandwidth).c_str(),
                c.allreduce_fit.network.bandwidth / 1e6, 100 * c.allreduce_fit.max_relative_error);
  out += line;
  std::snprintf(line, sizeof line, "fit p2p:       latency %.1f us, rate %s (%.4g MB/s); worst size off by %.1f%%\n",
                c.p2p_fit.network.latency * 1e6, format_rate(c.p2p_fit.network.bandwidth).c_str(),
                c.p2p_fit.network.bandwidth / 1e6, 100 * c.p2p_fit.max_relative_error);
  out += line;
  if (c.nominal_bandwidth > 0) {
    std::snprintf(line, sizeof line, "nominal link %s: allreduce reaches %.0f%% of it, p2p %.0f%%\n",
                  format_rate(c.nominal_bandwidth).c_str(), 100 * c.allreduce_fit.network.bandwidth / c.nominal_bandwidth,
                  100 * c.p2p_fit.network.bandwidth / c.nominal_bandwidth);
    out += line;
  }
  return out;
}

int run_calibrate(const CalibrateOptions& options) {
  Communicator& comm = world();
  try {
    const NetworkCalibration c = measure_network(comm, options);
    if (comm.rank() == 0) {
      save_calibration(c, options.out);
      std::fputs(calibration_table(c).c_str(), stdout);
      std::printf("wrote %s (use: trainer whatif RUN_DIR --calibration %s)\n", options.out.c_str(),
                  options.out.c_str());
    }
    return 0;
  } catch (const std::invalid_argument& e) {  // options or fit: the same on every rank
    if (comm.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace trainer::comm
