// DiLoCo through the trainer program under mpiexec (ResNet-20, small synthetic CIFAR-10, P = 2):
// Streaming DiLoCo after a dense warmup resumes bit for bit from a checkpoint taken inside a
// fragment's delay, and every rank's comm log holds each fragment's pseudo-gradient allreduce
// (ALLREDUCE_OUTER) with the fragment's bytes, in turn, at the steps the schedule says.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/sync/methods/outer/fragments.h"
#include "trainer/config/config.h"
#include "trainer/tasks/task.h"
#include "cifar_runs.h"
#include "process.h"
#include "resume_runs.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::require_identical_states;
using trainer::testing::ResumedRun;
using trainer::testing::run_command;
using trainer::testing::TempDir;

TEST_CASE("Streaming DiLoCo in the trainer resumes bit-identically inside a delay, and the log has the fragments",
          "[mpi][resume][diloco]") {
  const int P = 2;
  // Warmup steps 0-1 are dense; inner step k = step - 1 from step 2 on. H = 4, F = 2 (offsets 2
  // and 4), tau = 1: fragment 0 goes out after k = 1, 5, 9 (steps 2, 6, 10), fragment 1 after
  // k = 3, 7, 11 (steps 4, 8, 12), each outer step one step later. The checkpoint after 5 steps
  // (k = 3) holds fragment 1 in flight; the one after 10 steps (k = 8) holds none.
  const std::string args =
      "--set sync.method=diloco --set sync.dense_warmup_steps=2 --set sync.period=4 --set sync.fragments=2"
      " --set sync.sync_delay=1 --set sync.mixing=0.5 --set train.max_steps=14 --set train.checkpoint_every=5"
      " --set train.keep_checkpoints=10";
  TempDir ref("diloco_ref");
  Outcome full = run_command(trainer::testing::small_cifar_command(P, ref.path, args));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  CHECK_THAT(full.output, Contains("ALLREDUCE_OUTER"));

  trainer::Config config;
  std::vector<trainer::models::ParamView> views;
  const int64_t n = trainer::app::model_parameter_count(config, &views);  // resnet20
  const auto fragments = trainer::comm::plan_fragments(n, &views, 2);
  // The premise: the checkpoint after step 5 holds fragment 1's pseudo-gradient in flight and the
  // one after step 10 none, so its sync state is at least that many floats longer.
  const auto sync_state_bytes = [&](int step) {
    return trainer::testing::sync_state_bytes(ref.path / ("checkpoints/step_" + std::to_string(step)));
  };
  CHECK(sync_state_bytes(5) >= sync_state_bytes(10) + 4 * static_cast<size_t>(fragments[1].size()));

  for (int stop : {7, 10}) {  // resumes from the checkpoints after steps 5 (in flight) and 10
    const ResumedRun part(trainer::testing::small_cifar_on(P, args), stop);
    require_identical_states(ref.path / "checkpoints/step_14", part.dir.path / "checkpoints/step_14", P);
  }

  for (int r = 0; r < P; ++r) {
    std::ifstream log(ref.path / ("comm/rank" + std::to_string(r) + ".jsonl"));
    REQUIRE(log);
    std::vector<std::pair<int64_t, int64_t>> outer;  // (step, bytes)
    int64_t broadcasts = 0;
    std::string line;
    while (std::getline(log, line)) {
      const auto rec = nlohmann::json::parse(line);
      if (rec["op"] == "BROADCAST_OUTER") ++broadcasts;
      if (rec["op"] != "ALLREDUCE_OUTER") continue;
      CHECK(rec["phase"] == "compressed");
      CHECK(rec["bytes"] == rec["bytes_recv"]);
      outer.emplace_back(rec["step"].get<int64_t>(), rec["bytes"].get<int64_t>());
    }
    CHECK(broadcasts == 1);
    const std::vector<std::pair<int64_t, int64_t>> expected{
        {2, fragments[0].size() * 4}, {4, fragments[1].size() * 4}, {6, fragments[0].size() * 4},
        {8, fragments[1].size() * 4}, {10, fragments[0].size() * 4}, {12, fragments[1].size() * 4}};
    CHECK(outer == expected);
  }
}

TEST_CASE("A step skipped for a NaN inside a delay: the overlapped transfer gives the inline run's bits",
          "[mpi][nonfinite][diloco]") {
  const int P = 2;
  // As above; fragment 1 goes out in step 4 (k = 3) and would land in step 5, which rank 1's NaN
  // skips on every rank (k stays 3): the transfer keeps running through the skipped step and lands
  // after step 6 (k = 4). sync.overlap = false runs it inline, blocking step 4.
  const std::string args =
      "--set sync.method=diloco --set sync.dense_warmup_steps=2 --set sync.period=4 --set sync.fragments=2"
      " --set sync.sync_delay=1 --set sync.mixing=0.5 --set train.max_steps=10 --set train.checkpoint_every=0"
      " --set train.skip_nonfinite_steps=1";
  TempDir overlapped("diloco_nan_overlap"), inline_("diloco_nan_inline");
  Outcome a = run_command("env TRAINER_TEST_INJECT_NAN=1:5 " +
                          trainer::testing::small_cifar_command(P, overlapped.path, args + " --set sync.overlap=true"));
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  Outcome b = run_command("env TRAINER_TEST_INJECT_NAN=1:5 " +
                          trainer::testing::small_cifar_command(P, inline_.path, args + " --set sync.overlap=false"));
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  CHECK_THAT(a.output, Contains("skipped"));
  trainer::testing::require_identical_states(overlapped.path / "checkpoints/step_10",
                                             inline_.path / "checkpoints/step_10", P);
}
