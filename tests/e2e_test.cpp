// End-to-end tests of the trainer program: what a user sees for good and bad input.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/synthetic_cifar.h"
#include "process.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

Outcome run_trainer(const std::string& args) { return run_command(std::string(TRAINER_BINARY) + " " + args); }

std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("Unknown config key is one clear error with a suggestion", "[e2e]") {
  TempDir dir("unknown_key");
  const auto cfg = write_file(dir.path / "x.toml", "[optim]\nlearning_rate = 0.1\n");
  const Outcome o = run_trainer("--config " + cfg + " --dry-run");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("unknown key 'optim.learning_rate'") && Contains("did you mean 'optim.lr'"));
  CHECK_THAT(o.output, Contains(cfg));
}

TEST_CASE("Wrong type and out-of-range values name the key", "[e2e]") {
  TempDir dir("bad_values");
  const auto cfg = write_file(dir.path / "x.toml", "[optim]\nmomentum = 1.5\n");
  Outcome o = run_trainer("--config " + cfg + " --dry-run");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("optim.momentum") && Contains("out of range"));
  o = run_trainer("--config " + cfg + " --set optim.momentum=0.9 --set train.epochs=abc --dry-run");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("train.epochs"));
}

TEST_CASE("A model on the wrong kind of data is one clear error", "[e2e]") {
  const Outcome o = run_trainer("--config " + std::string(TRAINER_SOURCE_DIR) +
                                "/configs/quickstart_cifar.toml --set model.arch=deepspeech --dry-run");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("model.arch = \"deepspeech\" cannot train on data.dataset = \"cifar10\""));
}

TEST_CASE("Dry run of the paper's LSTM experiment: 27,569,568 parameters, 110,278,272 bytes", "[e2e]") {
  const Outcome o = run_trainer("--config " + std::string(TRAINER_SOURCE_DIR) + "/configs/an4_oktopk_paper.toml --dry-run");
  INFO(o.output);
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.output, Contains("27569568 parameters") && Contains("110278272 bytes") && Contains("oktopk"));
}

TEST_CASE("Dry run prints the model's parameter count and gradient size", "[e2e]") {
  const Outcome o = run_trainer("--config " + std::string(TRAINER_SOURCE_DIR) +
                                "/configs/cifar10_resnet20.toml --dry-run");
  INFO(o.output);
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.output, Contains("269722 parameters"));
  CHECK_THAT(o.output, Contains("1078888 bytes"));
}

TEST_CASE("Dry run prints the device, and runtime.device = cuda without CUDA is one line naming the key", "[e2e]") {
  const std::string cfg = std::string(TRAINER_SOURCE_DIR) + "/configs/quickstart_cifar.toml";
  Outcome o = run_trainer("--config " + cfg + " --dry-run");
  INFO(o.output);
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.output, Contains("device = \"cpu\"") && Contains("device: cpu"));
  o = run_trainer("--config " + cfg + " --set runtime.device=cuda --dry-run");
  INFO(o.output);
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("runtime.device = \"cuda\""));
#ifndef TRAINER_HAS_CUDA
  CHECK_THAT(o.output, Contains("built without CUDA support") && Contains("-DTRAINER_CUDA=ON"));
#endif
  o = run_trainer("--config " + cfg + " --set runtime.device=tpu --dry-run");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("runtime.device"));
}

TEST_CASE("Dry run prints the precision, and tf32 on the CPU is one line naming the key", "[e2e]") {
  const std::string cfg = std::string(TRAINER_SOURCE_DIR) + "/configs/quickstart_cifar.toml";
  Outcome o = run_trainer("--config " + cfg + " --dry-run");
  INFO(o.output);
  CHECK(o.exit_code == 0);
  CHECK_THAT(o.output, Contains("precision = \"fp32\"") && Contains("precision: fp32"));
  o = run_trainer("--config " + cfg + " --set runtime.precision=tf32 --dry-run");
  INFO(o.output);
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("runtime.precision = \"tf32\""));
  o = run_trainer("--config " + cfg + " --set runtime.precision=bf16 --dry-run");
  INFO(o.output);
  // bf16 runs where oneDNN has bf16 kernels (AVX-512), and is one line naming the ISA elsewhere.
  if (o.exit_code == 0)
    CHECK_THAT(o.output, Contains("precision: bf16 ("));
  else
    CHECK_THAT(o.output, Contains("runtime.precision = \"bf16\"") && Contains("at ISA"));
}

TEST_CASE("A truncated CIFAR file stops the run with one line naming it", "[e2e]") {
  TempDir dir("truncated");
  trainer::data::write_synthetic_cifar10(dir.path.string(), 200, 50, 1);
  fs::resize_file(dir.path / "data_batch_3.bin", 3073 * 10 + 17);
  const auto cfg = write_file(dir.path / "x.toml", "[data]\nroot = \"" + dir.path.string() + "\"\n");
  const Outcome o = run_trainer("--config " + cfg + " --set experiment.output_dir=" + (dir.path / "out").string());
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("data_batch_3.bin") && Contains("3073"));
}

TEST_CASE("A synthetic data.root of the other variant is one error naming data.root, never reused", "[e2e]") {
  TempDir dir("variant");
  trainer::data::write_synthetic_cifar10(dir.path.string(), 20, 10, 1);  // easy
  const auto cfg = write_file(dir.path / "x.toml", "[data]\nroot = \"" + dir.path.string() +
                                                       "\"\nsynthesize_if_missing = true\n");
  const std::string out = " --set experiment.output_dir=" + (dir.path / "out").string();
  const Outcome o = run_trainer("--config " + cfg + out + " --set data.synthetic_variant=hard");
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("data.root = " + dir.path.string()) && Contains("easy") &&
                           Contains("data.synthetic_variant = hard"));
  CHECK(trainer::data::synthetic_variant_in(dir.path.string()) == trainer::data::SyntheticVariant::kEasy);
  const Outcome bad = run_trainer("--config " + cfg + out + " --set data.synthetic_variant=medium --dry-run");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("data.synthetic_variant"));
}

TEST_CASE("The quickstart reaches 90% test accuracy in its default budget, outputs in place", "[e2e][slow]") {
  // The README's main job, unchanged but for where its data and outputs go.
  TempDir out("quickstart");
  const std::string args = "--config " + std::string(TRAINER_SOURCE_DIR) + "/configs/quickstart_cifar.toml" +
                           " --set data.root=" + (out.path / "data").string() +
                           " --set experiment.output_dir=" + (out.path / "run").string();
  const Outcome o = run_trainer(args);
  INFO(o.output);
  REQUIRE(o.exit_code == 0);
  const fs::path run = out.path / "run";
  REQUIRE(fs::exists(run / "config.toml"));
  REQUIRE(fs::exists(run / "summary.json"));
  nlohmann::json summary;
  std::ifstream(run / "summary.json") >> summary;
  CHECK(summary["final_accuracy"].get<double>() >= 0.90);

  // metrics.jsonl: step records with the documented fields, and one eval record per epoch.
  std::ifstream metrics(run / "metrics.jsonl");
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(metrics, line)) {
    auto r = nlohmann::json::parse(line);
    if (r.contains("split")) {
      ++evals;
      CHECK(r.contains("accuracy"));
    } else {
      ++steps;
      for (const char* key : {"step", "epoch", "time_s", "loss", "lr", "samples_per_s", "t_data_ms", "t_compute_ms",
                              "t_sync_ms", "t_optim_ms", "bytes_sent", "density", "phase"})
        CHECK(r.contains(key));
    }
  }
  CHECK(steps == 47);  // 468 steps, a record every 10 and one at the end
  CHECK(evals == 6);   // one per epoch
}
