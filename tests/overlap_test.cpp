// sync.overlap: gradient buckets exchanged on a communication thread while backward runs (dense
// allreduce; PowerSGD's factors). The bucket plan (gradient_buckets.h) on its own, and the trainer
// under mpiexec: a run with overlap equals the same run without it bit for bit (dense, every
// method's dense warmup, a 16-bit wire, PowerSGD per bucket), a slow rank changes timings only, and
// a NaN that appears during backward is still found, named and skipped on every rank, leaving no
// trace in PowerSGD's residual or warm start.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cifar_runs.h"
#include "comm_log_reading.h"
#include "comm/sync/methods/dense/gradient_buckets.h"
#include "process.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::comm::GradientBucket;
using trainer::comm::plan_gradient_buckets;
using trainer::models::ParamView;
using trainer::testing::Outcome;
using trainer::testing::rank_states;
using trainer::testing::require_identical_states;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

std::vector<ParamView> tensors_of(const std::vector<int64_t>& sizes) {
  std::vector<ParamView> views;
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    views.push_back({"t" + std::to_string(i), offset, {sizes[i]}});
    offset += sizes[i];
  }
  return views;
}

std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<GradientBucket>& buckets) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const GradientBucket& b : buckets) out.emplace_back(b.begin, b.end);
  return out;
}

std::string small_run(int ranks, const fs::path& out, const std::string& extra) {
  return trainer::testing::small_cifar_command(
      ranks, out, "--set train.max_steps=12 --set train.checkpoint_every=6 --set train.keep_checkpoints=10 " + extra);
}

}  // namespace

TEST_CASE("Buckets are cut from the end of the gradient, of whole tensors, closed once full (DDP's rule)",
          "[overlap]") {
  // Tensors of 4, 6, 3, 5 and 2 elements at offsets 0, 4, 10, 13, 18 (n = 20); caps 8, the first 3.
  // {t4} is 2 < 3, {t4, t3} is 7 >= 3: closed; {t2} 3, {t2, t1} 9 >= 8: closed; {t0} is what is left.
  const auto views = tensors_of({4, 6, 3, 5, 2});
  CHECK(ranges(plan_gradient_buckets(20, &views, 8, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{13, 20}, {4, 13}, {0, 4}});
  // A tensor larger than a bucket: what is open is closed, the tensor is cut into pieces of the cap
  // from its end, and its first piece stays open for the tensors before it.
  const auto big = tensors_of({2, 11, 1});
  CHECK(ranges(plan_gradient_buckets(14, &big, 4, 4)) ==
        std::vector<std::pair<int64_t, int64_t>>{{13, 14}, {9, 13}, {5, 9}, {0, 5}});
  // Without views: one tensor of n.
  CHECK(ranges(plan_gradient_buckets(10, nullptr, 4, 1)) ==
        std::vector<std::pair<int64_t, int64_t>>{{6, 10}, {2, 6}, {0, 2}});
  // Every plan covers [0, n) once, in descending order, at tensor boundaries; every bucket but the
  // last holds at least its cap and would be under it without its lowest tensor.
  for (int64_t cap : {6, 7, 8, 10, 20, 100}) {
    const int64_t first = std::max<int64_t>(1, cap / 2);
    const auto plan = plan_gradient_buckets(20, &views, cap, first);
    int64_t end = 20;
    for (size_t i = 0; i < plan.size(); ++i) {
      INFO("cap " << cap << ", bucket " << i);
      CHECK(plan[i].end == end);
      CHECK(std::any_of(views.begin(), views.end(), [&](const ParamView& v) { return v.offset == plan[i].begin; }));
      const int64_t bucket_cap = i == 0 ? first : cap;
      const auto lowest = std::find_if(views.begin(), views.end(), [&](const ParamView& v) { return v.offset == plan[i].begin; });
      if (i + 1 < plan.size()) CHECK(plan[i].size() >= bucket_cap);
      CHECK(plan[i].size() - lowest->numel() < bucket_cap);
      end = plan[i].begin;
    }
    CHECK(end == 0);
  }
}

TEST_CASE("sync.overlap: the same run with and without overlap is bit-identical", "[mpi][overlap]") {
  const int P = 3;
  // Small buckets, so that several go out during backward.
  const std::string buckets = " --set sync.bucket_mb=0.3 --set sync.first_bucket_mb=0.05";
  // Each method and the message that must leave during backward.
  for (const auto& [method, early_op] :
       {std::pair<std::string, std::string>{"--set sync.method=dense", "ALLREDUCE_DENSE"},
        {"--set sync.method=dense --set sync.wire_dtype=bf16", "ALLREDUCE_DENSE"},
        {"--set sync.method=oktopk --set sync.density=0.02 --set sync.dense_warmup_steps=6", "ALLREDUCE_DENSE"},
        {"--set sync.method=powersgd --set sync.dense_warmup_steps=4 --set sync.wire_dtype=bf16", "ALLREDUCE_P"}}) {
    SECTION(method) {
      TempDir on("overlap_on"), off("overlap_off");
      Outcome a = run_command(small_run(P, on.path, method + buckets + " --set sync.overlap=true"));
      INFO(a.output);
      REQUIRE(a.exit_code == 0);
      CHECK_THAT(a.output, !Contains("warning"));
      Outcome b = run_command(small_run(P, off.path, method + buckets + " --set sync.overlap=false"));
      INFO(b.output);
      REQUIRE(b.exit_code == 0);
      require_identical_states(on.path / "checkpoints/step_6", off.path / "checkpoints/step_6", P);
      require_identical_states(on.path / "checkpoints/step_12", off.path / "checkpoints/step_12", P);
      // The overlapped run's buckets did go out during backward; the other's after it.
      const int during = trainer::testing::messages_during_backward(on.path)[early_op];
      const int after = trainer::testing::messages_during_backward(off.path)[early_op];
      CHECK(during > 0);
      CHECK(after == 0);
    }
  }
}

TEST_CASE("sync.overlap: a rank whose backward is slow changes timings only", "[mpi][overlap]") {
  const int P = 2;
  TempDir even("overlap_even"), slow("overlap_slow");
  const std::string args = "--set sync.bucket_mb=0.3 --set sync.first_bucket_mb=0.05";
  Outcome a = run_command(small_run(P, even.path, args));
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  Outcome b = run_command(small_run(P, slow.path, args + " --set runtime.slowdown.rank=1 --set runtime.slowdown.factor=3"));
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  // The premise: rank 1 was slow. It sleeps twice its step's work after each backward (factor 3),
  // and rank 0 waits for it in the step's next collective, so rank 0 spends about twice rank 1's
  // compute time more in messages than rank 1 does; at least half of that must show.
  const auto fast = trainer::testing::rank_times(slow.path, 0), slowed = trainer::testing::rank_times(slow.path, 1);
  INFO("rank 0 in messages " << fast.messages_ms << " ms, rank 1 " << slowed.messages_ms << " ms, rank 1 computing "
                             << slowed.compute_ms << " ms");
  REQUIRE(slowed.compute_ms > 0);
  CHECK(fast.messages_ms - slowed.messages_ms > 1.0 * slowed.compute_ms);
  require_identical_states(even.path / "checkpoints/step_12", slow.path / "checkpoints/step_12", P);
}

TEST_CASE("sync.overlap: a NaN in a bucket sent during backward is named, and skipped on every rank",
          "[mpi][overlap][nonfinite]") {
  const int P = 2;
  // linear.bias is the last tensor: its bucket is the first to go out during backward.
  TempDir error("overlap_nan");
  Outcome o = run_command("env TRAINER_TEST_INJECT_NAN=1:5 " + small_run(P, error.path, ""));
  INFO(o.output);
  CHECK(o.exit_code == 3);
  CHECK_THAT(o.output, Contains("non-finite value at step 5: the gradient of linear.bias on rank 1"));

  // Dense, and PowerSGD past its warmup, whose factors of the NaN step went out during backward:
  // the skipped step must leave its residual and its warm-start Q as they were too.
  for (const std::string method : {"dense", "powersgd"}) {
    SECTION("skipped: " + method) {
      TempDir skip("overlap_nan_skip");
      Outcome s = run_command("env TRAINER_TEST_INJECT_NAN=1:3 " +
                              small_run(P, skip.path,
                                        "--set train.skip_nonfinite_steps=1 --set train.checkpoint_every=1"
                                        " --set train.max_steps=5 --set sync.dense_warmup_steps=1 --set sync.method=" +
                                            method));
      INFO(s.output);
      REQUIRE(s.exit_code == 0);
      CHECK_THAT(s.output, Contains("step skipped on every rank (1 in a row)"));
      // Step 3 changed nothing on any rank (checkpoint step_3 is written before it, step_4 after it).
      const auto before = rank_states(skip.path / "checkpoints/step_3", P);
      const auto after = rank_states(skip.path / "checkpoints/step_4", P);
      for (int r = 0; r < P; ++r)
        for (const std::string t : {"params", "buffers", "optimizer_state", "sync_state"}) {
          const std::string name = "rank" + std::to_string(r) + ".state/" + t;
          INFO(name);
          const bool unchanged = before.at(name) == after.at(name);
          CHECK(unchanged);
        }
    }
  }
}
