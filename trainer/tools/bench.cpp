#include "trainer/tools/bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/sync/methods/sparse/select.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/model.h"
#include "models/nets/deepspeech.h"
#include "models/nets/las.h"
#include "models/speech_model.h"
#include "optim/sgd.h"
#include "trainer/tools/bench_bound.h"
#include "trainer/step/device_batch.h"
#include "trainer/experiment.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// CPU seconds of every thread of this process.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// What one benchmark times: a model's training step on a fixed batch (the model and the batch live
// in the closures), and the PyTorch runs that mirror it.
struct Workload {
  std::string description;  // the batch, for the heading
  int64_t batch = 0;
  models::ParameterStore* params = nullptr;
  std::function<void()> forward, backward;
  std::function<double()> forward_flops;
  std::function<std::vector<models::StreamedWeights>()> streamed_weights;  // speech models: what bounds them
  std::string torch_script;  // under scripts/
  struct TorchRun {
    std::string label, key, args;  // output label, JSON key, arguments after the script
    // On a GPU the same run also times the step captured in one CUDA graph (its graph_median_ms).
    std::string graph_label = {}, graph_key = {};
  };
  std::vector<TorchRun> torch_runs;
};

Workload image_workload(const BenchOptions& o, models::Backend& backend) {
  struct State {
    std::unique_ptr<models::ImageClassifier> model;
    std::vector<float> x;
    std::vector<int32_t> labels;
    std::unique_ptr<DeviceBatch> device;  // x and labels where the model reads them
  };
  auto s = std::make_shared<State>();
  const int64_t batch = o.batch > 0 ? o.batch : 128;
  s->model = models::make_image_model({o.model, 10, 0.f}, backend, 0);
  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal;
  s->x.resize(batch * 3 * 32 * 32);
  for (auto& v : s->x) v = normal(rng);
  s->labels.resize(batch);
  for (auto& l : s->labels) l = static_cast<int32_t>(rng() % 10);
  s->device = std::make_unique<DeviceBatch>(backend);
  s->device->upload(s->x.data(), static_cast<int64_t>(s->x.size()), s->labels.data(), batch);
  backend.synchronize();

  Workload w;
  w.description = "batch " + std::to_string(batch) + ", conv algorithm " + o.conv_algorithm + ", precision " +
                  o.precision;
  w.batch = batch;
  w.params = &s->model->parameters();
  w.forward = [s, batch] {
    s->model->forward(models::Tensor{const_cast<float*>(s->device->images()), {batch, 3, 32, 32}},
                      s->device->labels(), models::Mode::kTrain);
  };
  w.backward = [s] { s->model->backward(); };
  w.forward_flops = [s] { return s->model->forward_flops(); };
  w.torch_script = "bench_torch.py";
  const bool bf16 = o.precision == "bf16";
  const std::string args = "--model " + o.model + " --batch " + std::to_string(batch) + (bf16 ? " --autocast-bf16" : "");
  const std::string mode = bf16 ? ", bf16 autocast" : "";
  if (o.device == "cpu") {
    w.torch_runs = {{"pytorch (default layout" + mode + ")", "torch_default_ms", args},
                    {"pytorch (channels_last" + mode + ")", "torch_channels_last_ms", args + " --channels-last"}};
    return w;
  }
  // On a GPU what a practitioner runs (channels_last, cudnn.benchmark, fused SGD), eager and with
  // the step in one CUDA graph, at the trainer's precision (TF32 only where the trainer has it);
  // then PyTorch's best, TF32 on, unless that is the run already made.
  const bool tf32 = o.precision == "tf32";
  const std::string gpu_mode = tf32 ? ", TF32" : mode;
  w.torch_runs = {{"pytorch (eager" + gpu_mode + ")", "torch_channels_last_ms",
                   args + " --channels-last" + (tf32 ? " --tf32" : ""), "pytorch (CUDA graph" + gpu_mode + ")",
                   "torch_graph_ms"}};
  if (!tf32)
    w.torch_runs.push_back({"pytorch (eager, TF32" + mode + ")", "torch_tf32_ms", args + " --channels-last --tf32",
                            "pytorch best (TF32 graph" + mode + ")", "torch_best_ms"});
  return w;
}

// deepspeech (CTC) or las (teacher forcing 1.0, label smoothing 0.1) on `batch` utterances of
// `frames` random feature frames each; utterance n has label_length - 1 + n % 3 random characters
// (ids 1..28). scripts/bench_torch_speech.py builds the same batch shapes.
Workload speech_workload(const BenchOptions& o, models::Backend& backend) {
  struct State {
    std::unique_ptr<models::SpeechModel> model;
    std::vector<float> features;
    std::vector<int32_t> frames, labels, label_lengths;
    std::unique_ptr<DeviceCopy<float>> device_features;  // the features where the model reads them
    models::SpeechInput input;
  };
  auto s = std::make_shared<State>();
  const int64_t batch = o.batch > 0 ? o.batch : 8;
  if (o.frames < 1 || o.label_length < 1) throw std::invalid_argument("--frames and --label-length must be positive");
  int64_t feature_dim = 0;
  if (o.model == "las") {
    models::LasOptions lo;
    lo.teacher_forcing = 1.0;
    lo.label_smoothing = 0.1;
    feature_dim = lo.feature_dim;
    s->model = models::make_las(backend, lo, 0);
  } else {
    feature_dim = models::DeepSpeechOptions{}.feature_dim;
    s->model = models::make_speech_model(o.model, backend, 0);
  }
  std::mt19937_64 rng(0);
  std::normal_distribution<float> normal;
  s->features.resize(batch * o.frames * feature_dim);
  for (auto& v : s->features) v = normal(rng);
  s->frames.assign(batch, static_cast<int32_t>(o.frames));
  for (int64_t n = 0; n < batch; ++n) {
    s->label_lengths.push_back(static_cast<int32_t>(o.label_length - 1 + n % 3));
    for (int32_t i = 0; i < s->label_lengths.back(); ++i) s->labels.push_back(static_cast<int32_t>(1 + rng() % 28));
  }
  s->device_features = std::make_unique<DeviceCopy<float>>(backend);
  s->input = {s->device_features->upload(s->features.data(), static_cast<int64_t>(s->features.size())),
              batch,
              o.frames,
              feature_dim,
              s->frames.data(),
              s->labels.data(),
              s->label_lengths.data()};
  backend.synchronize();

  Workload w;
  w.description = "batch " + std::to_string(batch) + " x " + std::to_string(o.frames) + " frames of " +
                  std::to_string(feature_dim) + " features, ~" + std::to_string(o.label_length) + " characters";
  w.batch = batch;
  w.params = &s->model->parameters();
  w.forward = [s] { s->model->forward(s->input, models::Mode::kTrain); };
  w.backward = [s] { s->model->backward(); };
  w.forward_flops = [s] { return s->model->forward_flops(); };
  w.streamed_weights = [s] { return s->model->streamed_weights(); };
  w.torch_script = "bench_torch_speech.py";
  // Every utterance is unpadded, so the LSTMs can run on the plain batch (the fastest PyTorch) or
  // on packed sequences as deepspeech.pytorch and most LAS code run them (a much slower backward on
  // the CPU).
  const std::string args = "--model " + o.model + " --batch " + std::to_string(batch) + " --frames " +
                           std::to_string(o.frames) + " --label-length " + std::to_string(o.label_length) +
                           (o.precision == "bf16" ? " --autocast-bf16" : "");
  const std::string mode = o.precision == "bf16" ? ", bf16 autocast" : "";
  w.torch_runs = {{"pytorch (unpacked LSTMs" + mode + ")", "torch_ms", args},
                  {"pytorch (packed sequences" + mode + ")", "torch_packed_ms", args + " --packed"}};
  return w;
}

// Runs a PyTorch reference and returns its JSON line, or null when torch is unavailable.
nlohmann::json run_torch(const BenchOptions& o, const std::string& script, const std::string& args, int threads) {
  // The reference runs on the same device as the trainer (a GPU run against PyTorch on the CPU
  // would compare nothing).
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " " + o.torch_python + " " +
                          std::string(TRAINER_SOURCE_DIR) + "/scripts/" + script + " " + args + " --device " +
                          o.device + " --threads " +
                          std::to_string(threads) + " --warmup " + std::to_string(o.warmup) + " --steps " +
                          std::to_string(o.steps) + " 2>/dev/null";
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

void print_torch_line(const std::string& label, double tms, int64_t batch, double step_gflop, double trainer_ms) {
  std::printf("  %-26s %9.1f ms/step %8.2f samples/s %6.1f GFLOP/s  trainer speedup %.2fx\n", label.c_str(), tms,
              batch * 1e3 / tms, step_gflop / (tms / 1e3), tms / trainer_ms);
}

// The GPU comparison in one line, as issue 31's table has it: ours, then PyTorch eager, in one CUDA
// graph, and at its best (TF32, graph), with two decimals (a GPU step is a few ms).
void print_side_by_side(const nlohmann::json& report) {
  std::printf("  side by side, ms/step: trainer %.2f (forward %.2f, backward %.2f)", report["trainer_ms"].get<double>(),
              report["trainer_forward_ms"].get<double>(), report["trainer_backward_ms"].get<double>());
  for (const auto& [key, label] : {std::pair<const char*, const char*>{"torch_channels_last_ms", "pytorch eager"},
                                   {"torch_graph_ms", "graph"},
                                   {"torch_best_ms", "best (TF32, graph)"}})
    if (report.contains(key)) std::printf(" | %s %.2f", label, report[key].get<double>());
  std::printf("\n");
}

bool is_one_of(const std::string& name, const std::vector<std::string>& names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::string bench_script(const std::string& name) { return std::string(TRAINER_SOURCE_DIR) + "/scripts/" + name; }

int run_bench(const BenchOptions& o) {
  if (o.conv_algorithm != "auto" && o.conv_algorithm != "direct" && o.conv_algorithm != "winograd")
    throw std::invalid_argument("--conv-algorithm must be auto, direct or winograd, got '" + o.conv_algorithm + "'");
  const bool speech = is_one_of(o.model, models::speech_model_names());
  if (!speech && !is_one_of(o.model, models::image_model_names())) {
    std::string known;
    for (const auto* names : {&models::image_model_names(), &models::speech_model_names()})
      for (const auto& n : *names) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("bench: unknown model '" + o.model + "' (known: " + known + ")");
  }
  Config runtime;
  runtime.runtime.threads = o.threads;
  runtime.runtime.conv_algorithm = o.conv_algorithm;
  if (!is_one_of(o.precision, kPrecisions)) throw std::invalid_argument("--precision must be fp32, tf32 or bf16");
  runtime.runtime.precision = o.precision;
  runtime.runtime.device = o.device;
  const int threads = configure_runtime(runtime, 1);
  models::Backend& backend = device_backend(runtime, 0);

  Workload w = speech ? speech_workload(o, backend) : image_workload(o, backend);
  models::ParameterStore& params = *w.params;
  optim::Sgd sgd(backend, params.size(), {0.9, false, 5e-4, false});
  std::vector<double> total, forward, backward, update;
  double cpu0 = 0;
  Clock::time_point wall0;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) cpu0 = process_cpu_seconds(), wall0 = Clock::now();
    const auto t0 = Clock::now();
    // Each phase waits for the device (a no-op on the CPU) before its clock is read.
    w.forward();
    backend.synchronize();
    const double f = ms_since(t0);
    const auto t1 = Clock::now();
    w.backward();
    backend.synchronize();
    const double b = ms_since(t1);
    const auto t2 = Clock::now();
    sgd.step(params.values(), params.grads(), 0.01);
    backend.synchronize();
    const double u = ms_since(t2);
    if (i < o.warmup) continue;
    forward.push_back(f), backward.push_back(b), update.push_back(u), total.push_back(ms_since(t0));
  }
  // CPU seconds per wall second while timing: about the thread count on an idle machine.
  const double cpu_per_wall = (process_cpu_seconds() - cpu0) / (ms_since(wall0) / 1e3);
  const double ms = median(total);
  // Forward + backward data + weights (a little high for DeepSpeech, whose first convolution
  // computes no input gradient: about a tenth of its convolutions' FLOPs).
  const double step_gflop = 3 * w.forward_flops() / 1e9;
  std::printf("bench: %s training step, %s, %d threads\n", o.model.c_str(), w.description.c_str(), threads);
  const double limit = o.device == "cpu" ? gemm_gflops(false) : 0;
  if (o.device == "cpu") {
    const models::Layout layout = models::cpu::dnnl_blocked_layout(backend_settings(runtime).precision);
    std::printf("  ISA: oneDNN %s (activations %s), selection %s; oneDNN sgemm 1024^3 here: %.1f GFLOP/s\n",
                models::cpu::dnnl_isa_name(), models::layout_name(layout), comm::selection_isa(), limit);
  }
  std::printf("  %-26s %9.1f ms/step %8.2f samples/s %6.1f GFLOP/s  (%.1f GFLOP/step)\n", "trainer", ms,
              w.batch * 1e3 / ms, step_gflop / (ms / 1e3), step_gflop);
  std::printf("  %-26s forward %.1f, backward %.1f, sgd %.1f ms; %.2f cpu/wall\n", "", median(forward),
              median(backward), median(update), cpu_per_wall);
  StepBound bound;
  if (o.device == "cpu" && w.streamed_weights) {
    // The speech step's memory-traffic bound (models/streamed_weights.h): the weights read one time
    // step at a time at the bandwidth of their working sets, the rest at the GEMM peak.
    const bool bf16 = o.precision == "bf16";
    const double peak = bf16 ? gemm_gflops(true) : limit;
    bound = step_bound(w.streamed_weights(), bf16 ? 2 : 4, step_gflop, peak);
    std::printf("  %-26s %9.1f ms/step: %.2f GB of weights streamed one time step at a time at %.1f GB/s (%.1f ms)"
                " + %.1f GFLOP at %.1f GFLOP/s (%s, %.1f ms); trainer at %.2fx the bound\n",
                "memory-traffic bound", bound.ms, bound.streamed_bytes / 1e9, bound.read_gbps, bound.streamed_ms,
                bound.rest_gflop, peak, bf16 ? "bf16 matmul 1024^3" : "sgemm 1024^3", bound.rest_ms, ms / bound.ms);
  }
  nlohmann::json report{{"model", o.model},
                        {"batch", w.batch},
                        {"threads", threads},
                        {"trainer_ms", ms},
                        {"trainer_forward_ms", median(forward)},
                        {"trainer_backward_ms", median(backward)},
                        {"trainer_sgd_ms", median(update)},
                        {"trainer_cpu_per_wall", cpu_per_wall},
                        {"gflop_per_step", step_gflop},
                        {"precision", o.precision}};
  if (o.device == "cpu") {
    report["isa"] = models::cpu::dnnl_isa_name();
    report["sgemm_gflops"] = limit;
  }
  if (speech)
    report["frames"] = o.frames, report["label_length"] = o.label_length;
  if (bound.ms > 0)
    report["bound_ms"] = bound.ms, report["bound_streamed_bytes"] = bound.streamed_bytes,
    report["bound_read_gbps"] = bound.read_gbps, report["bound_rest_gflop"] = bound.rest_gflop;
  else
    report["conv_algorithm"] = o.conv_algorithm;
  if (o.torch) {
    for (const auto& run : w.torch_runs) {
      nlohmann::json t = run_torch(o, w.torch_script, run.args, threads);
      if (t.is_null() || !t.contains("median_ms")) {
        std::printf("  %-26s unavailable (needs python3-torch: scripts/install_deps.sh --bench)\n", run.label.c_str());
        continue;
      }
      const double tms = t["median_ms"].get<double>();
      print_torch_line(run.label, tms, w.batch, step_gflop, ms);
      if (!t.contains("gpu"))
        std::printf("  %-26s torch %s, ATen CPU capability %s\n", "", t.value("torch_version", "?").c_str(),
                    t.value("cpu_capability", "?").c_str());
      else  // bench_torch.py on a GPU
        std::printf("  %-26s torch %s, cuDNN %d, %s, %s on %s\n", "", t.value("torch_version", "?").c_str(),
                    t.value("cudnn_version", 0), t.value("optimizer", "?").c_str(),
                    t.value("timing", "?").c_str(), t.value("gpu", "?").c_str());
      if (!run.graph_key.empty() && t.contains("graph_median_ms")) {
        const double gms = t["graph_median_ms"].get<double>();
        print_torch_line(run.graph_label, gms, w.batch, step_gflop, ms);
        report[run.graph_key] = gms;
      }
      if (t.contains("forward_ms"))
        std::printf("  %-26s forward %.1f, backward %.1f, sgd %.1f ms; %.2f cpu/wall\n", "",
                    t["forward_ms"].get<double>(), t["backward_ms"].get<double>(), t["optimizer_ms"].get<double>(),
                    t.value("cpu_per_wall", 0.0));
      report[run.key] = tms;
      report["torch_version"] = t.value("torch_version", "?");
      if (speech) report[run.key + "_cpu_per_wall"] = t.value("cpu_per_wall", 0.0);
    }
    if (o.device != "cpu" && !speech) print_side_by_side(report);
  }
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace trainer::app
