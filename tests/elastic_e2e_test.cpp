// Elastic resume (trainer/checkpoint/reshard.h): a checkpoint of P processes continued on P'. Under mpiexec,
// P = 4 -> 2 -> 4 for dense, Ok-Top-k, PowerSGD and local SGD through one epoch: the runs go on
// (loss after each resume near the loss before), every sample of the epoch is used exactly once
// across the change, Ok-Top-k recomputes its regions at the first step on the new P, and the
// residuals merged from the run's own checkpoint files keep their mean up to one float32 rounding.
// A P = 4 checkpoint on P = 3 (not a divisor of the global batch of 32): uneven shares whose
// weighted gradients give the same steps as P = 4 (frozen BN, so batch statistics do not differ).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/methods/sparse/oktopk.h"
#include "models/safetensors.h"
#include "tests/one_rank.h"
#include "trainer/experiment.h"
#include "trainer/tasks/task.h"
#include "cifar_runs.h"
#include "process.h"
#include "resume_runs.h"
#include "tests/method_keys.h"

namespace fs = std::filesystem;
namespace comm = trainer::comm;
using Catch::Matchers::Contains;
using trainer::testing::OneRank;
using trainer::testing::Outcome;
using trainer::testing::ResumedRun;
using trainer::testing::run_command;
using trainer::testing::small_cifar_on;
using trainer::testing::TempDir;

namespace {

// 640 images at a global batch of 32: one epoch is 20 steps.
constexpr int kImages = 640, kEpochSteps = 20;

std::string sample_logged(const fs::path& samples, const std::string& command) {
  return "env TRAINER_TEST_SAMPLE_LOG=" + samples.string() + " " + command;
}

// Every "epoch batch index..." line of every rank's sample log (trainer/tasks/image_task.h).
struct LoggedBatch {
  int64_t epoch, batch;
  std::vector<int64_t> indices;
};
std::vector<LoggedBatch> logged_batches(const fs::path& folder) {
  std::vector<LoggedBatch> all;
  for (const auto& f : fs::directory_iterator(folder)) {
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      LoggedBatch b;
      words >> b.epoch >> b.batch;
      for (int64_t i; words >> i;) b.indices.push_back(i);
      all.push_back(std::move(b));
    }
  }
  return all;
}

// What the sample logs say of epoch 0: how often each of `images` samples was used, and how many
// samples each global batch had (over all ranks). A batch of another epoch fails the test.
struct EpochUse {
  std::vector<int> used;
  std::map<int64_t, int64_t> batch_sizes;
};
EpochUse epoch_zero_use(const fs::path& folder, int images) {
  EpochUse use{std::vector<int>(images, 0), {}};
  for (const LoggedBatch& b : logged_batches(folder)) {
    CHECK(b.epoch == 0);
    use.batch_sizes[b.batch] += static_cast<int64_t>(b.indices.size());
    for (int64_t i : b.indices) ++use.used.at(i);
  }
  return use;
}

// Training loss by step from metrics.jsonl.
std::map<int64_t, double> losses(const fs::path& run) {
  std::map<int64_t, double> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    if (r.contains("phase")) out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  }
  return out;
}

double mean_loss(const std::map<int64_t, double>& l, int64_t from, int64_t to) {  // steps (from, to]
  double sum = 0;
  int n = 0;
  for (const auto& [step, loss] : l)
    if (step > from && step <= to) sum += loss, ++n;
  REQUIRE(n > 0);
  return sum / n;
}

// The sync_state blob of every rank of a checkpoint, in rank order.
std::vector<std::string> sync_states(const fs::path& checkpoint, int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) {
    const auto f = trainer::models::read_safetensors((checkpoint / ("rank" + std::to_string(r) + ".state")).string());
    const auto& bytes = f.at("sync_state").bytes;
    out.emplace_back(bytes.begin(), bytes.begin() + std::stoll(f.metadata.at("sync_state_bytes")));
  }
  return out;
}

trainer::Config method_config(const std::string& method) {
  trainer::Config c;
  c.sync.method = method;
  trainer::testing::set_if_own(c.sync, "density", 0.02);
  trainer::testing::set_if_own(c.sync, "period", 4);
  return c;
}

// The method as a rank of a `world` would build it (no warmup wrapper: the state is the method's).
std::unique_ptr<comm::GradientSync> build_sync(const std::string& method, comm::Communicator& world) {
  const trainer::Config c = method_config(method);
  std::vector<trainer::models::ParamView> views;
  const int64_t n = trainer::app::model_parameter_count(c, &views);
  comm::SyncOptions o = trainer::app::sync_options(c);
  o.dense_warmup_steps = 0;
  static std::vector<trainer::models::ParamView> kept;
  kept = views;
  return comm::make_gradient_sync(o, world, n, &kept);
}

std::vector<float> residual_of(comm::GradientSync& sync) {
  auto& ef = dynamic_cast<comm::ErrorFeedbackSync&>(sync).error_feedback();
  REQUIRE(ef.allocated());
  return std::vector<float>(ef.residual(), ef.residual() + ef.size());
}

// Each entry of the merged residual against the exact mean of the saved ones (long double holds the
// sum of these 4 floats exactly: they span at most 40 binades): every new rank holds the exact mean
// rounded once to float32, and the mean over the P' new ranks (P' equal values) is that value, so
// the average update owed moves by at most half an ulp of float32.
void require_mean_conserved(const std::vector<std::vector<float>>& old, const std::vector<float>& merged, int new_world) {
  int64_t off = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    long double exact = 0;
    for (const auto& r : old) exact += r[i];
    exact /= old.size();
    const long double new_mean = static_cast<long double>(merged[i]) * new_world / new_world;
    const long double half_ulp = std::ldexp(1.0L, std::ilogb(merged[i] == 0 ? 1e-38f : merged[i]) - 24);
    if (std::fabs(new_mean - exact) > half_ulp) ++off;
  }
  CHECK(off == 0);
}

}  // namespace

TEST_CASE("Elastic resume P = 4 -> 2 -> 4 through one epoch, every method", "[mpi][elastic]") {
  for (const std::string method : {"dense", "oktopk", "powersgd", "local_sgd", "diloco"}) {
    SECTION(method) {
      // Checkpoints at 6 and 12 fall in the compressed phase; local SGD averages after steps 4, 8,
      // 12 (period 4), so its step-6 checkpoint holds four different models.
      // DiLoCo counts its inner steps from the end of the warmup: after a warmup of 1 it syncs after
      // steps 4, 8, 12, so its step-6 checkpoint too holds four different models. Its outer SGD at lr 1
      // (local SGD's arithmetic): outer Nesterov at lr 0.7 this early raises the loss by itself
      // (2.51, 2.68, 2.91 over the three windows in a run without any resume), which the loss check
      // below would take for a bad resume.
      const std::string warmup = method == "diloco" ? "1 --set sync.outer_optimizer=sgd --set sync.outer_lr=1"
                                                      " --set sync.outer_momentum=0"
                                                    : "2";
      const std::string sync = "--set sync.method=" + method + " --set sync.density=0.02 --set sync.period=4" +
                               " --set sync.dense_warmup_steps=" + warmup + " --set train.max_steps=" +
                               std::to_string(kEpochSteps) +
                               " --set train.checkpoint_every=6 --set train.keep_checkpoints=10 --set train.log_every_steps=2";
      TempDir run("elastic_" + method), samples("samples_" + method);
      const auto cmd = [&](int p, const std::string& extra) {
        return sample_logged(samples.path, trainer::testing::small_cifar_command(p, run.path, sync + extra));
      };
      Outcome first = run_command(cmd(4, " --stop-after 6"));
      INFO(first.output);
      REQUIRE(first.exit_code == 0);
      Outcome second = run_command(cmd(2, " --stop-after 12 --resume latest"));
      INFO(second.output);
      REQUIRE(second.exit_code == 0);
      CHECK_THAT(second.output, Contains("re-sharded from 4 to 2 processes: global batch 32 kept (16 per process)"));
      Outcome third = run_command(cmd(4, " --resume latest"));
      INFO(third.output);
      REQUIRE(third.exit_code == 0);
      CHECK_THAT(third.output, Contains("re-sharded from 2 to 4 processes: global batch 32 kept (8 per process)"));

      // The data position: every sample of the epoch exactly once, each global batch whole.
      const auto [used, batch_sizes] = epoch_zero_use(samples.path, kImages);
      CHECK(std::count(used.begin(), used.end(), 1) == kImages);
      CHECK(batch_sizes.size() == kEpochSteps);
      for (const auto& [batch, size] : batch_sizes) CHECK(size == 32);

      // Training goes on: the loss of the steps after each resume is near that of the steps before.
      // A step's loss varies by about 0.2 between batches here, and the means of these 6- and
      // 8-step windows moved by 0.30 when only the allreduce's rounding changed (Open MPI's ring
      // instead of its default algorithm for local_sgd's averaging): 0.5 is far below what a
      // diverging resume gives (a loss of 5 and more, or NaN) and above that noise.
      const auto l = losses(run.path);
      REQUIRE(l.size() == kEpochSteps / 2);
      for (const auto& [step, loss] : l) CHECK(std::isfinite(loss));
      CHECK(std::fabs(mean_loss(l, 6, 12) - mean_loss(l, 0, 6)) < 0.5);
      CHECK(std::fabs(mean_loss(l, 12, 20) - mean_loss(l, 6, 12)) < 0.5);

      const fs::path step6 = run.path / "checkpoints/step_6";
      if (method == "local_sgd" || method == "diloco")
        CHECK_THAT(second.output, Contains("parameters: the mean of the 4 saved ranks' (they differed"));
      if (method == "oktopk" || method == "powersgd") {
        // The run's own step-6 files merged as each of the 2 new ranks merges them.
        std::vector<std::vector<float>> old;
        for (const std::string& s : sync_states(step6, 4)) {
          OneRank four(4);
          auto saved = build_sync(method, four);
          std::istringstream in(s);
          saved->load(in);
          old.push_back(residual_of(*saved));
        }
        OneRank two(2);
        auto merged = build_sync(method, two);
        merged->load_resharded(sync_states(step6, 4));
        require_mean_conserved(old, residual_of(*merged), 2);
        if (method == "oktopk") {
          const auto& ok = dynamic_cast<comm::OkTopk&>(*merged);
          CHECK(ok.region_bounds() == std::vector<int64_t>{0, ok.region_bounds()[2] / 2, ok.region_bounds()[2]});
        }
      }
      if (method == "oktopk") {
        // Regions are recomputed every 64 compressed steps: here at the first (step 2) and at the
        // first step on each new number of ranks.
        std::set<int64_t> region_steps;
        std::ifstream log(run.path / "comm/rank0.jsonl");
        for (std::string line; std::getline(log, line);) {
          const auto r = nlohmann::json::parse(line);
          if (r.value("op", "") == "ALLREDUCE_REGION") region_steps.insert(r["step"].get<int64_t>());
        }
        CHECK(region_steps == std::set<int64_t>{2, 6, 12});
      }
    }
  }
}

TEST_CASE("Elastic resume with sync.dgc: P = 4 -> 2, the velocity the saved ranks' mean", "[mpi][elastic][dgc]") {
  // DGC's velocity is a rank's own state, like the residual (comm/sync/wrappers/dgc.h): a resume on another
  // number of ranks takes their mean, which keeps what the average update still owes.
  const std::string sync = "--set sync.method=topka --set sync.density=0.02 --set sync.dense_warmup_steps=2"
                           " --set sync.dgc=true --set sync.density_warmup_steps=8 --set optim.grad_clip_norm=1"
                           " --set train.max_steps=12 --set train.checkpoint_every=6 --set train.log_every_steps=2";
  const ResumedRun run(small_cifar_on(4, sync), 6, small_cifar_on(2, sync));
  CHECK_THAT(run.second.output, Contains("residual and DGC velocity: the mean of the 4 saved ranks'"));
  const auto l = losses(run.dir.path);
  for (const auto& [step, loss] : l) CHECK(std::isfinite(loss));
  CHECK(std::fabs(mean_loss(l, 6, 12) - mean_loss(l, 0, 6)) < 0.5);
}

TEST_CASE("A P = 4 checkpoint resumes on P = 3: uneven shares weighted to the mean over the global batch",
          "[mpi][elastic]") {
  // Frozen BN: a step's gradient is the mean of its samples' gradients whatever the split, so 3
  // ranks of 10 or 11 samples must step as 4 ranks of 8 do, up to float rounding (unweighted
  // shares, the 11-sample ranks counting as much as the 10-sample one, differ by 2e-3 here).
  const std::string args = " --set model.freeze_batchnorm=true --set optim.lr=0.01 --set train.max_steps=9" +
                           std::string(" --set train.checkpoint_every=6 --set train.keep_checkpoints=10");
  TempDir four("elastic_p4"), three("elastic_p3"), samples4("samples_p4"), samples3("samples_p3");
  Outcome whole = run_command(sample_logged(samples4.path, trainer::testing::small_cifar_command(4, four.path, args)));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  fs::create_directories(three.path / "checkpoints");
  fs::copy(four.path / "checkpoints/step_6", three.path / "checkpoints/step_6", fs::copy_options::recursive);
  Outcome resumed = run_command(
      sample_logged(samples3.path, trainer::testing::small_cifar_command(3, three.path, args + " --resume latest")));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("re-sharded from 4 to 3 processes: global batch 32 kept (10 or 11 per process"));

  // Equal shares only, by the key: a clear error naming it.
  TempDir even("elastic_even");
  fs::create_directories(even.path / "checkpoints");
  fs::copy(four.path / "checkpoints/step_6", even.path / "checkpoints/step_6", fs::copy_options::recursive);
  Outcome refused = run_command(trainer::testing::small_cifar_command(
      3, even.path, args + " --set train.elastic_batch=keep_global_even --resume latest"));
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.output, Contains("train.elastic_batch") && Contains("3 processes do not divide") &&
                                 Contains("global batch of 32"));

  // The same samples in every global batch, split 10/11/11.
  std::map<int64_t, std::multiset<int64_t>> by4, by3;
  std::map<int64_t, std::multiset<int64_t>> shares;
  for (const LoggedBatch& b : logged_batches(samples4.path))
    if (b.batch >= 6) by4[b.batch].insert(b.indices.begin(), b.indices.end());
  for (const LoggedBatch& b : logged_batches(samples3.path)) {
    by3[b.batch].insert(b.indices.begin(), b.indices.end());
    shares[b.batch].insert(static_cast<int64_t>(b.indices.size()));
  }
  CHECK(by3 == by4);
  for (const auto& [batch, sizes] : shares) CHECK(sizes == std::multiset<int64_t>{10, 11, 11});

  const auto weights = [](const fs::path& run, int step) {
    const auto f = trainer::models::read_safetensors((run / "checkpoints" / ("step_" + std::to_string(step)) /
                                                      "rank0.state").string());
    const auto& b = f.at("params").bytes;
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  const auto at6 = weights(four.path, 6), by_four = weights(four.path, 9), by_three = weights(three.path, 9);
  double moved = 0, apart = 0;
  for (size_t i = 0; i < at6.size(); ++i) {
    moved += (by_four[i] - at6[i]) * double(by_four[i] - at6[i]);
    apart += (by_four[i] - by_three[i]) * double(by_four[i] - by_three[i]);
  }
  INFO("|w4 - w3| / |w4 - w6| = " << std::sqrt(apart / moved));
  CHECK(std::sqrt(apart / moved) < 1e-4);
}

TEST_CASE("Residual mean over ranks: the exact mean rounded once, the same bits on every new rank", "[elastic]") {
  // Entries from 2^-60 to 2^60, the 4 ranks' values at one entry within 16 binades of each other,
  // and entries where large values cancel (x + small - x: the plain float64 sum loses the small
  // value's low bits there, by far more than a float32 rounding of the result).
  const int64_t n = 4096;
  std::mt19937 rng(7);
  std::vector<std::vector<float>> old(4, std::vector<float>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int base = int(rng() % 121) - 60;
    for (auto& r : old) r[i] = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), base + int(rng() % 16));
    if (i % 8 == 0) {
      old[0][i] = 1234.5678f;
      old[1][i] = 1.2345678e-9f * (1 + i % 5);
      old[2][i] = -1234.5678f;
      old[3][i] = 3.3e-9f;
    }
  }
  std::vector<std::string> saved;
  for (const auto& r : old) {
    std::ostringstream out;
    const uint8_t present = 1;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(reinterpret_cast<const char*>(&present), 1);
    out.write(reinterpret_cast<const char*>(r.data()), n * 4);
    saved.push_back(out.str());
  }
  const auto merge = [&](const std::vector<std::string>& states) {
    std::vector<std::istringstream> streams(states.begin(), states.end());
    std::vector<std::istream*> in;
    for (auto& s : streams) in.push_back(&s);
    comm::ErrorFeedback ef(n);
    ef.load_mean(in, "test");
    return ef;
  };
  comm::ErrorFeedback merged = merge(saved), again = merge(saved);  // two new ranks
  const std::vector<float> mine(merged.residual(), merged.residual() + n), theirs(again.residual(), again.residual() + n);
  CHECK(std::memcmp(mine.data(), theirs.data(), n * 4) == 0);
  require_mean_conserved(old, mine, 3);

  std::ostringstream none;
  const uint8_t absent = 0;
  none.write(reinterpret_cast<const char*>(&n), 8);
  none.write(reinterpret_cast<const char*>(&absent), 1);
  CHECK_FALSE(merge({none.str(), none.str()}).allocated());
  CHECK_THROWS_WITH(merge({saved[0], none.str()}), Contains("1 of 2 saved ranks hold a residual"));
}

TEST_CASE("async_ps resumes on 5 and then 3 processes: servers re-split, workers restart at the global step",
          "[mpi][elastic][async_ps]") {
  // 4 processes (3 workers, 1 server: a global batch of 24) to the checkpoint at 4; on 5 (3 workers,
  // 2 servers) to 8; on 3 (2 workers of 12 samples, 1 server) to 12. Deterministic round robin: the
  // workers' clocks are equal at every checkpoint, so the data position is exact. From 4 to 8 only
  // the servers changed, and every update is element-wise: the run must match one that never
  // stopped, bit for bit, which holds only if the re-split shards carry the parameters, BN
  // statistics and momentum exactly and the new servers continue the same push order and versions.
  const std::string sync = " --set sync.method=async_ps --set sync.deterministic=true --set sync.max_staleness=-1" +
                           std::string(" --set train.max_steps=12 --set train.checkpoint_every=4") +
                           " --set train.keep_checkpoints=10 --set train.log_every_steps=2";
  TempDir ref("ps_elastic_ref"), run("ps_elastic"), samples("ps_elastic_samples");
  const auto cmd = [&](int p, int servers, const std::string& extra) {
    return sample_logged(samples.path, trainer::testing::small_cifar_command(
                                           p, run.path, sync + " --set sync.servers=" + std::to_string(servers) + extra));
  };
  Outcome whole = run_command(trainer::testing::small_cifar_command(4, ref.path, sync + " --stop-after 8"));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  Outcome first = run_command(cmd(4, 1, " --stop-after 4"));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  Outcome second = run_command(cmd(5, 2, " --stop-after 8 --resume latest"));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, Contains("re-sharded from 4 to 5 processes (3 workers and 1 to 3 and 2 servers): global "
                                     "batch 24 kept (8 per worker)") &&
                                Contains("joined and cut for 2 servers; every worker's clock (4 steps at the checkpoint) "
                                         "restarted at the global step 4"));
  Outcome third = run_command(cmd(3, 1, " --resume latest"));
  INFO(third.output);
  REQUIRE(third.exit_code == 0);
  CHECK_THAT(third.output, Contains("re-sharded from 5 to 3 processes (3 workers and 2 to 2 and 1 server): global "
                                    "batch 24 kept (12 per worker)"));

  // 1 -> 2 servers changed no bit: worker 0's parameters and BN statistics at step 8.
  const auto worker0 = trainer::testing::rank_states(run.path / "checkpoints/step_8", 1);
  const auto reference = trainer::testing::rank_states(ref.path / "checkpoints/step_8", 1);
  for (const char* t : {"rank0.state/params", "rank0.state/buffers"}) {
    INFO(t);
    const bool identical = worker0.at(t) == reference.at(t);
    CHECK(identical);
  }

  // The data position: global batches 0..11 of the epoch, each whole, no sample twice.
  const auto [used, batch_sizes] = epoch_zero_use(samples.path, kImages);
  CHECK(std::count(used.begin(), used.end(), 1) == 12 * 24);
  CHECK(std::count(used.begin(), used.end(), 0) == kImages - 12 * 24);
  CHECK(batch_sizes.size() == 12);
  for (const auto& [batch, size] : batch_sizes) CHECK(size == 24);

  // Training goes on at 2 workers of 12: the loss after the change near the loss before it.
  const auto l = losses(run.path);
  REQUIRE(l.size() == 6);
  for (const auto& [step, loss] : l) CHECK(std::isfinite(loss));
  CHECK(std::fabs(mean_loss(l, 8, 12) - mean_loss(l, 4, 8)) < 0.3);
}

TEST_CASE("async_ps with a straggler: after a resume on more workers every worker starts at the global step",
          "[mpi][elastic][async_ps]") {
  // Worker 0 at a quarter of worker 1's pace: at the checkpoint of global step 4 (8 pushes) their own
  // clocks differ, e.g. 2 and 6. On 4 processes (3 workers) every worker takes global batch 4 next.
  const std::string sync = " --set sync.method=async_ps --set sync.servers=1 --set train.max_steps=6" +
                           std::string(" --set train.checkpoint_every=4 --set runtime.slowdown.rank=0") +
                           " --set runtime.slowdown.factor=4";
  TempDir samples("ps_straggler_samples");
  const ResumedRun run(small_cifar_on(3, sync), 4, [&](const fs::path& out, const std::string& extra) {
    return sample_logged(samples.path, trainer::testing::small_cifar_command(4, out, sync + extra));
  });
  CHECK_THAT(run.second.output, Contains("re-sharded from 3 to 4 processes (2 workers and 1 to 3 and 1 server): "
                                         "global batch 16 kept (5 or 6 per worker, gradients weighted by share)") &&
                                    Contains("restarted at the global step 4"));
  for (const auto& f : fs::directory_iterator(samples.path)) {
    std::ifstream in(f.path());
    int64_t epoch = -1, batch = -1;
    in >> epoch >> batch;
    INFO(f.path().filename().string());
    CHECK(epoch == 0);
    CHECK(batch == 4);
  }
}
