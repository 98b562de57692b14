// SparseLoCo through the trainer program under mpiexec (ResNet-20, small synthetic CIFAR-10, P = 2):
// streaming SparseLoCo after a dense warmup resumes bit for bit from a checkpoint taken while a
// fragment's payloads are in flight; every rank's comm log holds each fragment's allgather
// (ALLGATHER_SPARSELOCO) with the codec's payload bytes, in turn, at the steps the schedule says;
// and the run resumes on 3 ranks (each accumulator the mean of the 2 saved).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/sync/codecs/chunk_codec.h"
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
using trainer::testing::small_cifar_on;
using trainer::testing::TempDir;

TEST_CASE("Streaming SparseLoCo in the trainer resumes bit-identically in flight, logs its payloads, reshards",
          "[mpi][resume][sparseloco]") {
  const int P = 2;
  // As diloco_e2e_test: warmup steps 0-1 dense; H = 4, F = 2, tau = 1: fragment 0 goes out at steps
  // 2, 6, 10, fragment 1 at steps 4, 8, 12. The checkpoint after 5 steps holds fragment 1 in flight.
  const std::string args =
      "--set sync.method=sparseloco --set sync.dense_warmup_steps=2 --set sync.period=4 --set sync.fragments=2"
      " --set sync.sync_delay=1 --set sync.density=0.02 --set sync.value_bits=2 --set train.max_steps=14"
      " --set train.checkpoint_every=5 --set train.keep_checkpoints=10";
  TempDir ref("sparseloco_ref");
  Outcome full = run_command(trainer::testing::small_cifar_command(P, ref.path, args));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  CHECK_THAT(full.output, Contains("ALLGATHER_SPARSELOCO"));

  const ResumedRun part(small_cifar_on(P, args), 7);
  require_identical_states(ref.path / "checkpoints/step_14", part.dir.path / "checkpoints/step_14", P);

  trainer::Config config;
  std::vector<trainer::models::ParamView> views;
  const int64_t n = trainer::app::model_parameter_count(config, &views);  // resnet20
  const auto fragments = trainer::comm::plan_fragments(n, &views, 2);
  auto payload = [&](int f) {
    return trainer::comm::ChunkCodec(trainer::comm::plan_chunks(fragments[static_cast<size_t>(f)], &views, 0.02), 2)
        .payload_bytes();
  };
  // The premise: the checkpoint after step 5 holds fragment 1 in flight (the payloads gathered so
  // far) and the one after step 10 none, so its sync state is longer by a payload at least.
  const auto sync_state_bytes = [&](int step) {
    return trainer::testing::sync_state_bytes(ref.path / ("checkpoints/step_" + std::to_string(step)));
  };
  CHECK(sync_state_bytes(5) >= sync_state_bytes(10) + static_cast<size_t>(payload(1)));
  for (int r = 0; r < P; ++r) {
    std::ifstream log(ref.path / ("comm/rank" + std::to_string(r) + ".jsonl"));
    REQUIRE(log);
    std::vector<std::pair<int64_t, int64_t>> gathers;  // (step, bytes)
    std::string line;
    while (std::getline(log, line)) {
      const auto rec = nlohmann::json::parse(line);
      if (rec["op"] != "ALLGATHER_SPARSELOCO") continue;
      CHECK(rec["phase"] == "compressed");
      CHECK(rec["bytes_recv"] == rec["bytes"].get<int64_t>() * (P - 1));
      gathers.emplace_back(rec["step"].get<int64_t>(), rec["bytes"].get<int64_t>());
    }
    const std::vector<std::pair<int64_t, int64_t>> expected{{2, payload(0)}, {4, payload(1)}, {6, payload(0)},
                                                            {8, payload(1)}, {10, payload(0)}, {12, payload(1)}};
    CHECK(gathers == expected);
    CHECK(payload(0) * 50 < fragments[0].size() * 4);  // over 50x below the fragment's fp32 bytes
  }

  // Elastic: the 2-rank checkpoint after step 10 resumed on 3 ranks.
  const ResumedRun wider(small_cifar_on(P, args), 10, small_cifar_on(3, args));
  CHECK_THAT(wider.second.output, Contains("error-feedback accumulator the mean of the 2 saved ranks'"));
}
