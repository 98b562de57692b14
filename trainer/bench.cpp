#include "trainer/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "optim/sgd.h"
#include "trainer/experiment.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs the PyTorch reference and returns its JSON line, or null when torch is unavailable.
nlohmann::json run_torch(const BenchOptions& o, int threads, bool channels_last) {
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " " + o.torch_python + " " +
                          std::string(TRAINER_SOURCE_DIR) + "/scripts/bench_torch.py --model " + o.model +
                          " --batch " + std::to_string(o.batch) + " --threads " + std::to_string(threads) +
                          " --warmup " + std::to_string(o.warmup) + " --steps " + std::to_string(o.steps) +
                          (channels_last ? " --channels-last" : "") + " 2>/dev/null";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return nullptr;
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  if (pclose(pipe) != 0) return nullptr;
  const auto pos = out.rfind('{');
  if (pos == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(pos), nullptr, false);
}

}  // namespace

int run_bench(const BenchOptions& o) {
  if (o.conv_algorithm != "auto" && o.conv_algorithm != "direct" && o.conv_algorithm != "winograd")
    throw std::invalid_argument("--conv-algorithm must be auto, direct or winograd, got '" + o.conv_algorithm + "'");
  Config runtime;
  runtime.runtime.threads = o.threads;
  runtime.runtime.conv_algorithm = o.conv_algorithm;
  const int threads = configure_runtime(runtime, 1);

  auto model = models::make_image_model({o.model, 10, 0.f}, models::cpu_backend(), 0);
  auto& params = model->parameters();
  optim::Sgd sgd(params.size(), {0.9, false, 5e-4, false});
  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(o.batch * 3 * 32 * 32);
  for (auto& v : x) v = normal(rng);
  std::vector<int32_t> labels(o.batch);
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);

  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    const auto t0 = Clock::now();
    model->forward(models::Tensor{x.data(), {o.batch, 3, 32, 32}}, labels.data(), models::Mode::kTrain);
    model->backward();
    sgd.step(params.values(), params.grads(), 0.01);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= o.warmup) times.push_back(ms);
  }
  const double ms = median(times);
  const double step_gflop = 3 * model->forward_flops() / 1e9;  // forward + backward data + weights
  std::printf("bench: %s training step, batch %lld, %d threads, conv algorithm %s\n", o.model.c_str(),
              static_cast<long long>(o.batch), threads, o.conv_algorithm.c_str());
  std::printf("  %-28s %9.1f ms/step  %8.0f samples/s  %6.1f GFLOP/s  (%.1f GFLOP/step)\n", "trainer", ms,
              o.batch * 1e3 / ms, step_gflop / (ms / 1e3), step_gflop);
  nlohmann::json report{{"model", o.model}, {"batch", o.batch}, {"threads", threads},
                        {"conv_algorithm", o.conv_algorithm}, {"trainer_ms", ms}, {"gflop_per_step", step_gflop}};
  if (o.torch) {
    for (bool cl : {false, true}) {
      nlohmann::json t = run_torch(o, threads, cl);
      const char* label = cl ? "pytorch (channels_last)" : "pytorch (default layout)";
      if (t.is_null() || !t.contains("median_ms")) {
        std::printf("  %-28s unavailable (needs python3-torch: scripts/install_deps.sh --bench)\n", label);
        continue;
      }
      const double tms = t["median_ms"].get<double>();
      std::printf("  %-28s %9.1f ms/step  %8.0f samples/s  %6.1f GFLOP/s  trainer speedup %.2fx\n", label, tms,
                  o.batch * 1e3 / tms, step_gflop / (tms / 1e3), tms / ms);
      report[cl ? "torch_channels_last_ms" : "torch_default_ms"] = tms;
    }
  }
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace trainer::app
