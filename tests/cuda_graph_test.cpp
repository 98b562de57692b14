// runtime.cuda_graph (trainer/step_graph.h): a ResNet-20 run whose steps are one recorded CUDA graph
// each ends exactly where the same run with eager steps ends: with runtime.deterministic = true the
// weights, the optimizer state and every logged loss are the same bit for bit after 10 steps. Three
// runs each way: SGD with momentum at a constant rate; a cosine schedule with warmup (the rate
// changes every step, so a rate baked into the graph would show); and Adam (its bias correction
// counts updates) with a non-finite step injected (TRAINER_TEST_INJECT_NAN) and skipped in both, in
// the middle of the steps a graph run launches before it reads their results.
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

void require_same(const std::string& extra, const std::string& env = "") {
  TempDir eager_dir, graph_dir;
  const auto eager = run(eager_dir, false, extra, env);
  const auto graph = run(graph_dir, true, extra, env);
  for (const char* file : {"model.safetensors", "rank0.state"}) {
    const auto a = trainer::models::read_safetensors((eager / file).string());
    const auto b = trainer::models::read_safetensors((graph / file).string());
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      INFO(file << ": " << a.tensors[i].name);
      REQUIRE(a.tensors[i].name == b.tensors[i].name);
      const bool identical = a.tensors[i].bytes == b.tensors[i].bytes;  // not the bytes: megabytes on failure
      CHECK(identical);
    }
  }
  const auto la = logged_losses(eager_dir.path), lb = logged_losses(graph_dir.path);
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

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }
