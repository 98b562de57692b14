#include "trainer/tools/bench_sync.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/device_communicator.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/registry.h"
#include "comm/sync/methods/sparse/select.h"
#include "models/device_buffer.h"
#include "models/speech_model.h"

namespace trainer::comm {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Standard normals by Box-Muller on a counter-based generator: fast, parallel and reproducible.
void fill_normal(std::vector<float>& v, uint64_t seed) {
  const int64_t pairs = static_cast<int64_t>(v.size()) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t r = splitmix64(seed * 0x100000001b3ULL + j);
    const double u1 = ((r >> 11) + 1.0) * 0x1.0p-53, u2 = (splitmix64(r) >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2 * std::log(u1));
    v[2 * j] = static_cast<float>(radius * std::cos(2 * M_PI * u2));
    v[2 * j + 1] = static_cast<float>(radius * std::sin(2 * M_PI * u2));
  }
  if (v.size() % 2) v.back() = 0.f;
}

// Two pools per rank, a shared one (same seed everywhere) and this rank's; the gradient of a step
// is 0.5 x a window of the first + a window of the second, at offsets that change every step.
struct Pools {
  int64_t n, pad;
  std::vector<float> shared, own;
  Pools(int64_t n_, int rank) : n(n_), pad(std::min<int64_t>(n_, 1 << 20)), shared(n_ + pad), own(n_ + pad) {
    fill_normal(shared, 12345);
    fill_normal(own, 1000 + rank);
  }
  void gradient(int64_t step, float* g) const {
    const int64_t a = (step * 7919) % pad, b = (step * 104729 + 13) % pad;
    const float* s = shared.data() + a;
    const float* o = own.data() + b;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] = 0.5f * s[i] + o[i];
  }
};

struct MethodResult {
  std::string method;
  double ms = 0, reuse_ms = 0, exact_ms = 0;
  int reuse_steps = 0, exact_steps = 0;
  double sent = 0, received = 0;  // bytes per rank and step: mean over steps, max over ranks
  double theory_words = 0;
  std::string theory;
  // A method that says what it selected (SyncStats::selected_local, selected_global): the mean
  // counts over k; -1 when it does not say.
  double local_over_k = -1, global_over_k = -1;
};

double max_over_ranks(Communicator& comm, double v) {
  CommLog::Pause pause(comm.log());
  comm.allreduce(&v, 1, DType::kF64, ReduceOp::kMax, "BENCH");
  return v;
}

// A layer-wise method's views (its spec's layer_wise: powersgd): the DeepSpeech model's tensors (what
// the paper's 27,569,568 parameters are).
std::vector<models::ParamView> deepspeech_views() {
  return models::make_speech_model("deepspeech", models::cpu_backend(), 0)->parameters().views();
}

// `sync_comm`: what carries the method's collectives (`comm` itself on the host; the device's
// communicator for device buffers).
MethodResult bench_method(Communicator& comm, Communicator& sync_comm, const Pools& pools, const SyncBenchOptions& o,
                          const std::string& method, const std::vector<models::ParamView>* views = nullptr,
                          int64_t rank = 0) {
  const int64_t n = o.n, k = top_k_count(o.density, n);
  SyncOptions so;
  so.method = method;
  if (method_key(sync_method(method), "density")) so.set("density", o.density);
  if (rank > 0) so.set("rank", rank);
  models::Backend* device = o.backend && !o.backend->is_host() ? o.backend : nullptr;
  so.backend = device;
  auto sync = make_gradient_sync(so, device ? sync_comm : comm, n, views);
  // A method that reuses an estimate over steps (SyncStats::fresh_estimate: oktopk's thresholds) has
  // its fresh and reused steps timed apart over all the steps; the others keep none, so a couple
  // of warmup steps and 16 timed ones are enough (the first step says which).
  int warmup = o.warmup, steps = o.steps;
  // 64-byte aligned, as the trainer's gradient buffer (models/tensor.cpp).
  std::unique_ptr<float, void (*)(void*)> grad_buffer(
      static_cast<float*>(std::aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64)), std::free);
  float* grad = grad_buffer.get();
  models::DeviceBuffer on_device = device ? models::DeviceBuffer(*device, n) : models::DeviceBuffer();
  std::vector<double> all, reuse, exact;
  double sent_sum = 0, recv_sum = 0, local_sum = 0, global_sum = 0;
  bool selects = false;
  SyncBuffers b{nullptr, device ? on_device.data() : grad, n};
  for (int j = 0; j < warmup + steps; ++j) {
    pools.gradient(j, grad);
    if (device) models::copy_to_device(*device, grad, n, on_device.data());  // waits: not timed
    {
      CommLog::Pause pause(comm.log());
      comm.barrier("BENCH");
    }
    int64_t sent = 0, received = 0;
    comm.log().take_totals(sent, received);
    const auto t0 = Clock::now();
    const SyncStats stats = sync->reduce(b, j);
    if (device) device->synchronize();  // the step ends when the device is done
    const double ms = max_over_ranks(comm, ms_between(t0, Clock::now()));
    comm.log().take_totals(sent, received);
    if (j == 0 && stats.fresh_estimate < 0) warmup = std::min(o.warmup, 2), steps = std::min(o.steps, 16);
    if (j < warmup) continue;
    all.push_back(ms);
    if (stats.fresh_estimate >= 0) (stats.fresh_estimate ? exact : reuse).push_back(ms);
    sent_sum += sent;
    recv_sum += received;
    selects = stats.selected_local >= 0;
    if (selects) local_sum += stats.selected_local, global_sum += stats.selected_global;
  }
  MethodResult r;
  r.method = rank ? method + " r" + std::to_string(rank) : method;
  r.ms = median(all);
  r.reuse_ms = median(reuse);
  r.exact_ms = median(exact);
  r.reuse_steps = static_cast<int>(reuse.size());
  r.exact_steps = static_cast<int>(exact.size());
  r.sent = max_over_ranks(comm, sent_sum / steps);
  r.received = max_over_ranks(comm, recv_sum / steps);
  if (selects) {
    r.local_over_k = max_over_ranks(comm, local_sum / steps / k);
    r.global_over_k = global_sum / steps / k;
  }
  // The method's own statement of what it sends (GradientSync::wire_volume).
  const WireVolume volume = sync->wire_volume();
  if (volume.words >= 0) {
    r.theory_words = volume.words;
    r.theory = volume.formula;
  }
  return r;
}

// One streaming read of a buffer (the memory limit a selection pass is measured against): a sum
// with 16 independent lanes per thread, so the adds do not serialize.
float stream_sum(const float* x, int64_t n) {
  float total = 0;
#pragma omp parallel reduction(+ : total)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t begin = n * t / T, end = n * (t + 1) / T;
    float lanes[16] = {};
    int64_t i = begin;
    for (; i + 16 <= end; i += 16)
      for (int j = 0; j < 16; ++j) lanes[j] += x[i + j];
    for (; i < end; ++i) lanes[0] += x[i];
    for (float l : lanes) total += l;
  }
  return total;
}

// The selection kernel alone, on this process: medians of `reps` runs.
nlohmann::json bench_selection(const Pools& pools, int64_t n, int64_t k, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  constexpr int reps = 7;
  std::vector<float> x(pools.shared.begin(), pools.shared.begin() + n);
  std::vector<float> grad(pools.own.begin(), pools.own.begin() + n), residual(n, 0.f);
  SparseList out;
  SelectScratch scratch;
  OutputScratch output;
  // Untimed setup before each timed run (the accumulating forms change the residual).
  auto time_with = [&](auto&& setup, auto&& fn) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      setup();
      const auto t0 = Clock::now();
      fn();
      t.push_back(ms_between(t0, Clock::now()));
    }
    return median(t);
  };
  auto time = [&](auto&& fn) { return time_with([] {}, fn); };
  const std::vector<float> residual0(pools.own.begin() + 1, pools.own.begin() + 1 + n);  // a stand-in residual
  auto reset_residual = [&] { std::memcpy(residual.data(), residual0.data(), n * sizeof(float)); };
  volatile float sink = 0;
  const double read_ms = time([&] { sink = stream_sum(x.data(), n); });
  const double read2_ms = time([&] { sink = stream_sum(x.data(), n) + stream_sum(grad.data(), n); });
  float t_exact = 0;
  const double exact_ms = time([&] { t_exact = select_top_k(read_only(x.data()), n, k, false, out, scratch); });
  const int64_t exact_count = out.size();
  const double pass_ms = time([&] { select_at_least(read_only(x.data()), n, t_exact, out, scratch); });
  // The accumulating forms on grad + residual (the residual grows a little every repetition).
  const double fused_exact_ms = time_with(reset_residual, [&] {
    select_top_k(SelectSource{grad.data(), residual.data(), nullptr}, n, k, false, out, scratch);
  });
  const float t_acc = kth_largest_magnitude(out, k, scratch);
  const double fused_ms = time_with(reset_residual, [&] {
    select_at_least(SelectSource{grad.data(), residual.data(), nullptr}, n, t_acc, out, scratch);
  });
  const std::vector<ListRef> runs{{out.index(), out.value(), out.size()}};
  std::unique_ptr<float, void (*)(void*)> dst(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64)),
                                              std::free);
  const double output_ms = time([&] { write_sparse_output(dst.get(), n, runs, 4.f, output); });
  std::vector<float> mags(n);
  std::vector<double> nth;
  for (int r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
    const auto t0 = Clock::now();
    std::nth_element(mags.begin(), mags.begin() + (n - k), mags.end());
    nth.push_back(ms_between(t0, Clock::now()));
  }
  const double nth_ms = median(nth);
  const bool agree = mags[n - k] == t_exact;
  omp_set_num_threads(saved);
  (void)sink;
  return {{"threads", threads},
          {"stream_read_ms", read_ms},
          {"stream_read_two_buffers_ms", read2_ms},
          {"exact_topk_ms", exact_ms},
          {"exact_topk_selected", exact_count},
          {"threshold_pass_ms", pass_ms},
          {"accumulate_pass_ms", fused_ms},
          {"accumulate_exact_topk_ms", fused_exact_ms},
          {"write_output_ms", output_ms},
          {"nth_element_ms", nth_ms},
          {"nth_element_agrees", agree}};
}

// A reference script's whole output (stderr too), noting a non-zero exit.
std::string output_of(const std::string& cmd) {
  std::string out;
  if (std::FILE* pipe = popen((cmd + " 2>&1").c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, pipe)) out += buf;
    if (pclose(pipe) != 0) out += "\n(exit status non-zero)";
  }
  return out;
}

// PyTorch's side, run by rank 0 while the others wait in a barrier (Open MPI yields the cores when
// oversubscribed): one JSON line per factor rank. Prints torch's hook time beside ours.
nlohmann::json bench_torch_powersgd(Communicator& comm, const SyncBenchOptions& o,
                                    const std::vector<MethodResult>& results) {
  nlohmann::json rows = nlohmann::json::array();
  if (comm.rank() == 0) {
    std::string ranks;
    for (int64_t r : o.powersgd_ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(omp_get_max_threads()) + " " + o.torch_python + " " +
                            o.torch_script + " --world " + std::to_string(comm.size()) + " --ranks " + ranks +
                            " --threads " + std::to_string(omp_get_max_threads()) + " --steps " +
                            std::to_string(std::min(o.steps, 16));
    const std::string out = output_of(cmd);
    size_t begin = 0;
    while (begin < out.size()) {
      const size_t end = std::min(out.find('\n', begin), out.size());
      const auto line = nlohmann::json::parse(out.substr(begin, end - begin), nullptr, false);
      if (line.is_object() && line.contains("hook_ms")) rows.push_back(line);
      begin = end + 1;
    }
    if (rows.empty()) {
      std::printf("pytorch powerSGD_hook: unavailable (needs python3-torch: scripts/install_deps.sh --bench):\n%s\n",
                  out.substr(0, 2000).c_str());
    } else {
      std::printf("pytorch DDP powerSGD_hook (gloo, CPU, the same shapes, P = %d, %d thread(s) per rank):\n",
                  comm.size(), omp_get_max_threads());
      std::printf("  %-12s %10s %10s %12s %10s %10s\n", "rank", "torch ms", "ours ms", "torch/ours", "ddp step", "no-op step");
      for (auto& row : rows) {
        const std::string label = "powersgd r" + std::to_string(row["rank"].get<int64_t>());
        double ours = 0;
        for (const auto& r : results)
          if (r.method == label) ours = r.ms;
        row["ours_ms"] = ours;
        std::printf("  %-12s %10.1f %10.1f %12.2f %10.1f %10.1f\n", label.c_str(), row["hook_ms"].get<double>(), ours,
                    ours > 0 ? row["hook_ms"].get<double>() / ours : 0.0, row["ddp_step_ms"].get<double>(),
                    row["noop_step_ms"].get<double>());
      }
      std::printf(
          "  torch ms: median DDP backward with powerSGD_hook minus the median with a no-op hook (the hook's "
          "compression and allreduces), slowest rank per step\n");
    }
  }
  comm.barrier("BENCH");
  return rows;
}

// Rank 0 runs scripts/bench_torch_sparse.py on the same device (the others wait) and prints its
// compression step beside our sparse methods' whole steps (at P = 1 those are compression, the
// comm log's own calls and the output: the fair comparison).
nlohmann::json bench_torch_sparse(Communicator& comm, const SyncBenchOptions& o,
                                  const std::vector<MethodResult>& ours) {
  nlohmann::json t;
  if (comm.rank() == 0) {
    const std::string out = output_of(o.torch_python + " " + o.torch_sparse_script + " --device " + o.device +
                                      " --n " + std::to_string(o.n) + " --density " + std::to_string(o.density));
    // The script's last line is its JSON.
    const size_t last = out.rfind("\n{");
    t = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1), nullptr, false);
    if (!t.is_object() || !t.contains("topk_ms")) {
      std::printf("pytorch sparse compression: unavailable (a torch with this device is needed):\n%s\n",
                  out.substr(0, 2000).c_str());
      t = nullptr;
    } else {
      std::printf("pytorch on the same device (%s, torch %s), compression alone per step, ms (median):\n",
                  t.value("gpu", o.device).c_str(), t.value("torch_version", "?").c_str());
      std::printf("  threshold pipeline eager %.3f, compiled %s; exact torch.topk pipeline %.3f; one read of the "
                  "gradient %.3f\n",
                  t.value("threshold_ms", 0.0),
                  t.contains("threshold_compiled_ms") ? std::to_string(t["threshold_compiled_ms"].get<double>()).c_str()
                                                      : "-",
                  t.value("topk_ms", 0.0), t.value("read_ms", 0.0));
      for (const MethodResult& r : ours)
        if (r.reuse_steps > 0 && r.exact_steps > 0)
          std::printf("  ours (%s's whole step at P = %d): threshold-reuse %.3f, exact %.3f\n", r.method.c_str(),
                      comm.size(), r.reuse_ms, r.exact_ms);
    }
  }
  comm.barrier("BENCH");
  return t;
}

}  // namespace

int run_sync_bench(const SyncBenchOptions& o) {
  Communicator& comm = world();
  const int p = comm.size(), rank = comm.rank();
  if (o.n < 1 || o.n >= (int64_t{1} << 31) || !(o.density > 0 && o.density <= 1) || o.steps < 1 || o.warmup < 0) {
    if (rank == 0) std::fprintf(stderr, "bench sync: need 1 <= n < 2^31, 0 < density <= 1, steps >= 1, warmup >= 0\n");
    return 2;
  }
  for (int64_t r : o.powersgd_ranks)
    if (r < 1 || r > 1024) {
      if (rank == 0) std::fprintf(stderr, "bench sync: --powersgd-ranks must be in [1, 1024], got %lld\n",
                                  static_cast<long long>(r));
      return 2;
    }
  for (const auto& m : o.methods) {
    // The methods that sync parameters rather than each step's gradient have nothing to time here.
    const SyncMethod* method = find_sync_method(m);
    if (!method || !method->can.keeps_parameters_equal) {
      if (rank == 0) std::fprintf(stderr, "bench sync: unknown or unsupported method '%s'\n", m.c_str());
      return 2;
    }
  }
  const int64_t k = top_k_count(o.density, o.n);
  const Pools pools(o.n, rank);
  if (rank == 0)
    std::printf(
        "bench sync: n = %lld, density %.4g (k = %lld), P = %d, %d thread(s) per rank; %d warmup + %d timed "
        "steps (baselines 2 + 16); selection kernels %s\n",
        static_cast<long long>(o.n), o.density, static_cast<long long>(k), p, omp_get_max_threads(), o.warmup, o.steps,
        selection_isa());
  nlohmann::json report{{"bench", "sync"}, {"n", o.n}, {"density", o.density},
                        {"k", k},          {"P", p},   {"threads_per_rank", omp_get_max_threads()},
                        {"selection_isa", selection_isa()}};
  // On a device: its communicator (NCCL, or MPI through pinned staging) for the device buffers.
  const bool on_device = o.backend && !o.backend->is_host();
  SyncCommunicator carrier;
  if (on_device) {
    carrier = make_sync_communicator(o.communicator, comm, *o.backend);
    report["device"] = o.backend->describe();
    if (rank == 0)
      std::printf("  on %s: gradients in device memory; %s\n", o.backend->describe().c_str(),
                  carrier.description.c_str());
  }
  Communicator& sync_comm = carrier.device ? *carrier.device : comm;
  std::vector<MethodResult> results;
  bool powersgd = false;
  for (const auto& m : o.methods) {
    const SyncMethod& spec = sync_method(m);
    std::vector<models::ParamView> views;
    if (spec.can.layer_wise) {
      views = deepspeech_views();
      if (views.back().offset + views.back().numel() != o.n) {
        if (rank == 0) std::printf("  %s skipped: it runs on the DeepSpeech shapes, n = 27569568\n", m.c_str());
        continue;
      }
    }
    // A method with a rank (powersgd's) runs at each of --powersgd-ranks; the others once.
    std::vector<int64_t> ranks{0};
    if (method_key(spec, "rank")) ranks = o.powersgd_ranks;
    try {
      for (int64_t r : ranks)
        results.push_back(bench_method(comm, sync_comm, pools, o, m, views.empty() ? nullptr : &views, r));
    } catch (const std::invalid_argument& e) {  // the method's own refusal, the same on every rank (gtopk's P)
      if (rank == 0) std::printf("  %s skipped: %s\n", m.c_str(), e.what());
      continue;
    }
    powersgd |= m == "powersgd";
  }
  if (rank == 0) {
    std::printf("  %-10s %9s %9s %9s %12s %12s  %-17s %7s  %s\n", "method", "ms/step", "reuse ms", "exact ms",
                "sent B/step", "recv B/step", "theory (words)", "ratio", "selected/k (local, global)");
    for (const auto& r : results) {
      const double ratio = r.theory_words > 0 ? std::max(r.sent, r.received) / (4 * r.theory_words) : 0.0;
      std::printf("  %-10s %9.2f %9s %9s %12.0f %12.0f  %-17s %7.3f", r.method.c_str(), r.ms,
                  r.reuse_steps ? std::to_string(r.reuse_ms).substr(0, 7).c_str() : "-",
                  r.exact_steps ? std::to_string(r.exact_ms).substr(0, 7).c_str() : "-", r.sent, r.received,
                  r.theory.c_str(), ratio);
      if (r.local_over_k >= 0) std::printf("  %.2f, %.2f", r.local_over_k, r.global_over_k);
      std::printf("\n");
      report["methods"].push_back({{"method", r.method},
                                   {"ms", r.ms},
                                   {"reuse_ms", r.reuse_ms},
                                   {"reuse_steps", r.reuse_steps},
                                   {"exact_ms", r.exact_ms},
                                   {"exact_steps", r.exact_steps},
                                   {"sent_bytes", r.sent},
                                   {"recv_bytes", r.received},
                                   {"theory", r.theory},
                                   {"theory_bytes", 4 * r.theory_words},
                                   {"ratio", ratio},
                                   {"local_over_k", r.local_over_k},
                                   {"global_over_k", r.global_over_k}});
    }
    std::printf(
        "  sent/recv: the comm log's per-rank totals (a collective counts this rank's own block); ratio = "
        "max(sent, recv) / theory\n");
  }
  // PowerSGD's PyTorch reference is DDP's hook on gloo (the CPU): on a device it would not compare.
  if (powersgd && !o.torch_script.empty() && !on_device)
    report["torch_powersgd"] = bench_torch_powersgd(comm, o, results);
  if (on_device && !o.torch_sparse_script.empty()) report["torch_sparse"] = bench_torch_sparse(comm, o, results);
  if (o.selection && !on_device) {
    if (rank == 0) {
      std::printf("selection on rank 0 alone (%lld floats = %.0f MB, k = %lld):\n", static_cast<long long>(o.n),
                  o.n * 4 / 1e6, static_cast<long long>(k));
      std::printf("  %-7s %8s %8s %8s %8s %8s %8s %8s %8s %8s %9s %8s\n", "threads", "read", "exact", "x read", "pass",
                  "x read", "read 2", "acc pass", "acc exact", "output", "nth", "x exact");
      std::vector<int> counts{1};
      if (omp_get_num_procs() > 1) counts.push_back(omp_get_num_procs());
      for (int threads : counts) {
        const auto s = bench_selection(pools, o.n, k, threads);
        const double read = s["stream_read_ms"], exact = s["exact_topk_ms"], pass = s["threshold_pass_ms"];
        std::printf("  %-7d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.1f %8.1f%s\n", threads, read,
                    exact, exact / read, pass, pass / read, s["stream_read_two_buffers_ms"].get<double>(),
                    s["accumulate_pass_ms"].get<double>(), s["accumulate_exact_topk_ms"].get<double>(),
                    s["write_output_ms"].get<double>(), s["nth_element_ms"].get<double>(),
                    s["nth_element_ms"].get<double>() / exact,
                    s["nth_element_agrees"].get<bool>() ? "" : "  (nth_element disagrees!)");
        report["selection"].push_back(s);
      }
      std::printf(
          "  ms, medians. read: one streaming read of the buffer (a sum); exact: exact top-k (sampled bound, "
          "one pass, histogram + nth_element over the collected entries); pass: the threshold pass alone "
          "(a reuse step); read 2: reading two buffers; acc pass / acc exact: the same forming grad + "
          "residual into the residual; output: writing the dense output of k entries; nth: "
          "std::nth_element on a prepared |x| copy\n");
    }
    comm.barrier("BENCH");
  }
  if (rank == 0) std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace trainer::comm
