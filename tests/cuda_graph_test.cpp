// runtime.cuda_graph (trainer/step/step_graph.h): a ResNet-20 run whose steps are one recorded CUDA graph
// each ends exactly where the same run with eager steps ends: with runtime.deterministic = true the
// weights, the optimizer state and every logged loss are the same bit for bit after 10 steps. Three
// runs each way: SGD with momentum at a constant rate; a cosine schedule with warmup (the rate
// changes every step, so a rate baked into the graph would show); and Adam (its bias correction
// counts updates) with a non-finite step injected (TRAINER_TEST_INJECT_NAN) and skipped in both, in
// the middle of the steps a graph run launches before it reads their results.
// And two processes with runtime.deterministic write the same checkpoint (eager both times).
// Neither comparison can flip on timing: under runtime.deterministic the convolutions' algorithms
// come from cuDNN's heuristics, not from cudnnFind's timings (models/cuda/cudnn_conv.cpp), and
// cuBLAS has one workspace of its own (models/cuda/cuda_backend.cpp), so each process computes the
// same kernels in the same order.
// Needs a GPU (exits 77 without one); scripts/gpu_check.sh runs it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_parity.h"
#include "models/safetensors.h"
#include "process.h"

namespace {

using trainer::testing::run_command;
using trainer::testing::TempDir;

const TempDir& dataset() {
  static TempDir dir("graph_data");
  return dir;
}

// One 10-step run on the GPU; returns its output folder's checkpoint of step 10.
std::filesystem::path run(const TempDir& out, bool graph, const std::string& extra, const std::string& env = "") {
  const std::string command =
      env + " " + TRAINER_BINARY + " --config " + TRAINER_SOURCE_DIR + "/configs/quickstart_cifar.toml" +
      " --set runtime.device=cuda --set runtime.deterministic=true --set runtime.cuda_graph=" +
      (graph ? "true" : "false") + " --set data.root=" + dataset().path.string() +
      " --set data.synthetic_train_size=1280 --set data.synthetic_test_size=100 --set data.batch_size=64" +
      " --set data.loader_threads=1 --set train.max_steps=10 --set train.log_every_steps=5" +
      " --set train.eval_every_steps=1000 --set experiment.output_dir=" + out.path.string() + " " + extra;
  const auto o = run_command(command);
  INFO(command << "\n" << o.output);
  REQUIRE(o.exit_code == 0);
  // The graph run must have recorded its steps (and the eager one not).
  CHECK((o.output.find("each step is one CUDA graph") != std::string::npos) == graph);
  return out.path / "checkpoints" / "step_10";
}

std::vector<std::string> logged_losses(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<std::string> losses;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos && line.find("\"split\"") == std::string::npos)
      losses.push_back(line.substr(at, line.find(',', at) - at));
  }
  return losses;
}

// Runs `first` and `second` (graph or eager) and requires the same checkpoint and logged losses.
void require_same(const std::string& extra, const std::string& env = "", bool first = false, bool second = true) {
  TempDir first_dir, second_dir;
  const auto one = run(first_dir, first, extra, env);
  const auto two = run(second_dir, second, extra, env);
  for (const char* file : {"model.safetensors", "rank0.state"}) {
    const auto a = trainer::models::read_safetensors((one / file).string());
    const auto b = trainer::models::read_safetensors((two / file).string());
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      INFO(file << ": " << a.tensors[i].name);
      REQUIRE(a.tensors[i].name == b.tensors[i].name);
      const bool identical = a.tensors[i].bytes == b.tensors[i].bytes;  // not the bytes: megabytes on failure
      CHECK(identical);
    }
  }
  const auto la = logged_losses(first_dir.path), lb = logged_losses(second_dir.path);
  REQUIRE(la.size() == 2);
  CHECK(la == lb);
}

}  // namespace

TEST_CASE("a captured step equals an eager step: SGD with momentum, constant rate") {
  require_same("--set optim.schedule=constant --set optim.warmup_steps=0");
}

TEST_CASE("a captured step equals an eager step: the rate changes every step") {
  require_same("--set optim.schedule=cosine --set optim.warmup_steps=4 --set optim.grad_clip_norm=1");
}

TEST_CASE("a captured step equals an eager step: Adam, a non-finite step skipped in both") {
  // Step 6 is the graph run's fifth recorded step, inside the window 5..9 it launches before reading.
  require_same("--set optim.name=adam --set optim.lr=0.001 --set train.skip_nonfinite_steps=2",
               "TRAINER_TEST_INJECT_NAN=0:6");
}

TEST_CASE("a step recorded again after each evaluation equals an eager step") {
  // An evaluation moves the step's buffers, so the graph is recorded again after it (step_graph.h):
  // evaluations at steps 3, 6 and 9 make three recordings after the first.
  require_same("--set optim.schedule=constant --set optim.warmup_steps=0 --set train.eval_every_steps=3");
}

TEST_CASE("two processes with runtime.deterministic write the same checkpoint") {
  require_same("--set optim.schedule=constant --set optim.warmup_steps=0", "", false, false);
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }
