// The divergence guard (trainer/divergence_guard.h) through the trainer under mpiexec, 2 ranks:
// DiLoCo with an outer lr far too large diverges after its dense warmup and stops with one
// "diverged:" line, exit status 4, a complete checkpoint and a "diverged" record in metrics.jsonl;
// with train.divergence_guard = false the same run goes on; a normal compressed run watched with
// small windows never trips it; a loss that turns non-finite after the switch is "diverged" too.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cifar_runs.h"
#include "process.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

constexpr int kRanks = 2;

// ResNet-20 at batch 8 per rank (tests/cifar_runs.h); a window of 5 steps after a dense warmup of 10.
std::string command(const fs::path& out, const std::string& extra) {
  return trainer::testing::small_cifar_command(
      kRanks, out, "--set train.max_steps=40 --set sync.dense_warmup_steps=10 --set train.divergence_window=5 " + extra);
}

// DiLoCo syncing every step with an outer Nesterov step 40 times too large: fine while dense, its
// loss climbs within a few steps of the switch.
const std::string kDiverging = "--set sync.method=diloco --set sync.period=1 --set sync.outer_lr=DIVERGE_LR";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// metrics.jsonl's records that carry `key`.
std::vector<nlohmann::json> records_with(const fs::path& run, const std::string& key) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto r = nlohmann::json::parse(line);
    if (r.contains(key)) out.push_back(r);
  }
  return out;
}

}  // namespace
