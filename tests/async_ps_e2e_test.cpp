// The asynchronous parameter server (sync.method = "async_ps") end to end under mpiexec, on the small
// synthetic CIFAR of tests/cifar_runs.h: synchronous rounds equal dense SGD, deterministic runs
// resume bit for bit, the staleness a known push order must give, a failing worker ends the job,
// and bad settings are one clear error.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <iterator>
#include <thread>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cifar_runs.h"
#include "models/safetensors.h"
#include "process.h"
#include "resume_runs.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::require_identical_states;
using trainer::testing::ResumedRun;
using trainer::testing::run_command;
using trainer::testing::small_cifar_command;
using trainer::testing::small_cifar_on;
using trainer::testing::TempDir;

namespace {

// The largest difference between two checkpoints' trainable parameters (model.safetensors: rank 0's,
// which after the final round are the servers'). BN running statistics are left out: dense ranks keep
// their own, async_ps servers average the workers' changes.
double max_parameter_difference(const fs::path& a, const fs::path& b) {
  const auto x = trainer::models::read_safetensors((a / "model.safetensors").string());
  const auto y = trainer::models::read_safetensors((b / "model.safetensors").string());
  REQUIRE(x.tensors.size() == y.tensors.size());
  double worst = 0;
  int compared = 0;
  for (const auto& t : x.tensors) {
    if (t.name.find("running_") != std::string::npos || t.name.find("num_batches") != std::string::npos) continue;
    const std::vector<float> u = t.as_f32(), v = y.at(t.name).as_f32();
    REQUIRE(u.size() == v.size());
    for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(u[i]) - v[i]));
    ++compared;
  }
  REQUIRE(compared > 20);  // ResNet-20's weights, not only a few tensors
  return worst;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

const std::string kAsync = " --set sync.method=async_ps --set sync.servers=1";

}  // namespace

TEST_CASE("async_ps with max_staleness = 0 is dense synchronous SGD up to the order of the gradient sum",
          "[mpi][async_ps]") {
  SECTION("2 workers: a sum of two floats does not depend on order, so the weights are bit-identical") {
    // Dense at P = 2 against 2 workers and 2 servers (P = 4): the same data shards, the same
    // optimizer per element, each server's shard of the mean gradient equal to dense's.
    TempDir dense("dense2"), ps("ps2");
    const std::string steps = " --set train.max_steps=8";
    Outcome d = run_command(small_cifar_command(2, dense.path, steps));
    INFO(d.output);
    REQUIRE(d.exit_code == 0);
    Outcome a = run_command(small_cifar_command(
        4, ps.path, steps + " --set sync.method=async_ps --set sync.servers=2 --set sync.max_staleness=0"));
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CHECK(max_parameter_difference(dense.path / "checkpoints/step_8", ps.path / "checkpoints/step_8") == 0.0);
  }
  SECTION("3 workers: within float32 rounding of a reordered 3-term sum") {
    // MPI's allreduce and the server add three gradients in different orders (the server in arrival
    // order): each element of the first step's mean differs by about one float32 ulp, and batch norm
    // at batch 8 amplifies that in the second step's gradient (measured: 1e-7 to 3e-6 after 2 steps,
    // 1e-2 after 8, hence 2 steps). A wrong shard, a missing 1/W or a wrong lr changes weights by lr
    // times a gradient entry, 5e-4 and more even at the warmup's lr: 1e-4 separates the two.
    TempDir dense("dense3"), ps("ps3");
    const std::string steps = " --set train.max_steps=2";
    Outcome d = run_command(small_cifar_command(3, dense.path, steps));
    INFO(d.output);
    REQUIRE(d.exit_code == 0);
    Outcome a = run_command(small_cifar_command(4, ps.path, steps + kAsync + " --set sync.max_staleness=0"));
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    const double diff = max_parameter_difference(dense.path / "checkpoints/step_2", ps.path / "checkpoints/step_2");
    CHECK(diff <= 1e-4);
  }
}

TEST_CASE("async_ps deterministic: staleness follows the round-robin order and resume is bit-identical",
          "[mpi][async_ps][resume]") {
  // 2 workers and 1 server, no staleness bound, pushes taken in rank order: 0, 1, 0, 1, ... Worker
  // 0's first push finds the version it pulled (tau 0); every later one finds worker 1's push applied
  // since (tau 1). Steps 5 and 10 are checkpoint rounds: all workers pull the same version there, and
  // the next push of worker 0 is again tau 0.
  const std::string sync = kAsync + " --set sync.deterministic=true --set train.max_steps=16 --set train.checkpoint_every=5";
  TempDir ref("det_ref");
  Outcome r = run_command(small_cifar_command(3, ref.path, sync));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> intervals;
  for (const auto& rec : read_jsonl(ref.path / "metrics.jsonl"))
    if (rec.contains("staleness_mean")) intervals.push_back(rec);
  REQUIRE(intervals.size() == 4);  // steps 1-5, 6-10, 11-15, 16 (log every 5)
  for (const auto& rec : intervals) {
    INFO(rec.dump());
    const int64_t done = rec["step"].get<int64_t>();
    const int64_t steps = done == 16 ? 1 : 5;
    // One tau-0 push per interval (after the start or a checkpoint round), the rest tau 1.
    CHECK(rec["staleness_mean"].get<double>() == Approx(static_cast<double>(steps - 1) / steps));
    CHECK(rec["staleness_max"].get<int64_t>() == (steps > 1 ? 1 : 0));
  }
  // The server's comm log: every worker's every step pushed and pulled once.
  std::map<int, int> pushes, pulls;
  for (const auto& rec : read_jsonl(ref.path / "comm/rank2.jsonl")) {
    if (rec["op"] == "PUSH_GRAD") pushes[rec["peer"].get<int>()] += 1;
    if (rec["op"] == "PULL_PARAMS") pulls[rec["peer"].get<int>()] += 1;
  }
  CHECK(pushes == std::map<int, int>{{0, 16}, {1, 16}});
  CHECK(pulls == std::map<int, int>{{0, 16}, {1, 16}});

  for (int stop : {7, 10}) {  // between checkpoints 5 and 10, and on one
    // A --stop-after at or before the resumed step never comes, for the servers as for the workers:
    // the run goes to its end (the servers once stopped at once and the workers waited for good).
    const std::string past_stop = stop == 10 ? " --stop-after 4" : "";
    const ResumedRun part(small_cifar_on(3, sync), stop, small_cifar_on(3, sync + past_stop));
    // Workers' parameters, BN statistics and pulled versions; the server's shard, optimizer state,
    // version and push count.
    require_identical_states(ref.path / "checkpoints/step_16", part.dir.path / "checkpoints/step_16", 3);
  }
}

TEST_CASE("async_ps: two servers apply the same updates as one, through asynchronous steps and meets",
          "[mpi][async_ps]") {
  // Deterministic, no staleness bound: both servers take the pushes in the same order, and every
  // update is element-wise, so cutting the model in two shards changes no bit. Between meets server
  // 1 answers every push at once and server 0 grants; at each meet (the checkpoints at 4 and 8, the
  // end at 12) server 1 sends every worker one more reply with the meet's shard. A worker that went
  // on with an older shard computes other gradients, and the weights differ.
  const std::string base = " --set sync.method=async_ps --set sync.deterministic=true --set sync.max_staleness=-1" +
                           std::string(" --set train.max_steps=12 --set train.checkpoint_every=4");
  TempDir one("servers1"), two("servers2");
  Outcome a = run_command(small_cifar_command(3, one.path, base + " --set sync.servers=1"));
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  Outcome b = run_command(small_cifar_command(4, two.path, base + " --set sync.servers=2"));
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  CHECK(max_parameter_difference(one.path / "checkpoints/step_12", two.path / "checkpoints/step_12") == 0.0);
  // Server 1's meet replies: 12 pushes per worker answered at once, and one more at each of the 3
  // meets for every worker but the one whose push completed it (that one's answer was held).
  std::map<int, int> pulls;
  for (const auto& rec : read_jsonl(two.path / "comm/rank3.jsonl"))
    if (rec["op"] == "PULL_PARAMS") pulls[rec["peer"].get<int>()] += 1;
  CHECK(pulls[0] + pulls[1] == 2 * 12 + 3);
}

TEST_CASE("async_ps: DC-ASGD's compensation acts through dc_lambda, and is none at lambda 0",
          "[mpi][async_ps]") {
  // Deterministic, 2 workers: every push after the first has tau = 1, so w_now differs from the
  // weights the gradient was computed on and g*g*(w_now - w_pulled) is not zero.
  const std::string base = kAsync + " --set sync.deterministic=true --set train.max_steps=6";
  TempDir none("dc_none"), zero("dc_zero"), dc("dc_on");
  for (const auto& [dir, extra] :
       std::vector<std::pair<const TempDir*, std::string>>{{&none, " --set sync.staleness_lr=none"},
                                                          {&zero, " --set sync.staleness_lr=dc --set sync.dc_lambda=0"},
                                                          {&dc, " --set sync.staleness_lr=dc --set sync.dc_lambda=2"}}) {
    Outcome o = run_command(small_cifar_command(3, dir->path, base + extra));
    INFO(o.output);
    REQUIRE(o.exit_code == 0);
  }
  CHECK(max_parameter_difference(none.path / "checkpoints/step_6", zero.path / "checkpoints/step_6") == 0.0);
  CHECK(max_parameter_difference(none.path / "checkpoints/step_6", dc.path / "checkpoints/step_6") > 0.0);
}

TEST_CASE("async_ps: momentum_correction runs the servers' SGD at max(0, momentum - (1 - 1/W)), and "
          "momentum_and_lr keeps lr / (1 - momentum)",
          "[mpi][async_ps]") {
  // 2 workers: 1 - 1/W = 0.5, so momentum 0.5 corrected is plain SGD, bit for bit (deterministic
  // push order). Without the correction the same run differs (momentum 0.5 acts from the second
  // update on). momentum_and_lr also doubles the lr, (1 - 0) / (1 - 0.5): plain SGD at lr 0.2
  // (the schedule is linear in the base lr, and doubling is exact in floating point).
  const std::string base =
      kAsync + " --set sync.deterministic=true --set sync.staleness_lr=none --set train.max_steps=6";
  TempDir corrected("mc_on"), plain("mc_plain"), both("mc_lr"), plain_lr("mc_plain_lr");
  for (const auto& [dir, extra] : std::vector<std::pair<const TempDir*, std::string>>{
           {&corrected, " --set optim.momentum=0.5 --set sync.momentum_correction=momentum"},
           {&plain, " --set optim.momentum=0"},
           {&both, " --set optim.momentum=0.5 --set sync.momentum_correction=momentum_and_lr"},
           {&plain_lr, " --set optim.momentum=0 --set optim.lr=0.2"}}) {
    Outcome o = run_command(small_cifar_command(3, dir->path, base + extra));
    INFO(o.output);
    REQUIRE(o.exit_code == 0);
  }
  CHECK(max_parameter_difference(corrected.path / "checkpoints/step_6", plain.path / "checkpoints/step_6") == 0.0);
  CHECK(max_parameter_difference(both.path / "checkpoints/step_6", plain_lr.path / "checkpoints/step_6") == 0.0);
  // max_staleness = 0 is synchronous: no implicit momentum to correct for.
  TempDir sync_on("mc_sync_on"), sync_off("mc_sync_off");
  const std::string sync = base + " --set sync.max_staleness=0 --set optim.momentum=0.5";
  for (const auto& [dir, extra] : std::vector<std::pair<const TempDir*, std::string>>{
           {&sync_on, " --set sync.momentum_correction=momentum"},
           {&sync_off, " --set sync.momentum_correction=none"}}) {
    Outcome o = run_command(small_cifar_command(3, dir->path, sync + extra));
    INFO(o.output);
    REQUIRE(o.exit_code == 0);
  }
  CHECK(max_parameter_difference(sync_on.path / "checkpoints/step_6", sync_off.path / "checkpoints/step_6") == 0.0);
}

TEST_CASE("async_ps: gap-aware damping changes the updates and resumes bit for bit", "[mpi][async_ps][resume]") {
  // Deterministic, 2 workers, no bound: every push after the first of a round is stale, so the gap
  // is not zero. The servers' running average of the steps is part of the checkpoint: a run resumed
  // from step 4 ends with the same bits as one run through.
  const std::string base =
      kAsync + " --set sync.deterministic=true --set train.max_steps=8 --set train.checkpoint_every=4";
  TempDir ref("gap_ref"), none("gap_none");
  Outcome r = run_command(small_cifar_command(3, ref.path, base + " --set sync.staleness_lr=gap"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Outcome n = run_command(small_cifar_command(3, none.path, base + " --set sync.staleness_lr=none"));
  INFO(n.output);
  REQUIRE(n.exit_code == 0);
  CHECK(max_parameter_difference(ref.path / "checkpoints/step_8", none.path / "checkpoints/step_8") > 0.0);
  const ResumedRun part(small_cifar_on(3, base + " --set sync.staleness_lr=gap"), 4);
  require_identical_states(ref.path / "checkpoints/step_8", part.dir.path / "checkpoints/step_8", 3);
}

namespace {

// Pushes per worker in the server's (world rank `server`) comm log, and the widest gap between two
// workers' counts at any point of the server's push order.
struct PushCounts {
  std::map<int, int> per_worker;
  int widest = 0;
};
PushCounts push_counts(const fs::path& log) {
  PushCounts c;
  for (const auto& rec : read_jsonl(log)) {
    if (rec["op"] != "PUSH_GRAD") continue;
    c.per_worker[rec["peer"].get<int>()] += 1;
    int lo = INT32_MAX, hi = 0;
    for (const auto& [w, n] : c.per_worker) lo = std::min(lo, n), hi = std::max(hi, n);
    if (c.per_worker.size() > 1) c.widest = std::max(c.widest, hi - lo);
  }
  return c;
}

}  // namespace

TEST_CASE("async_ps: the run is a budget of pushes, and max_staleness bounds how far a worker runs ahead",
          "[mpi][async_ps]") {
  // Rank 1 three times slower (runtime.slowdown). 10 steps of 2 workers are 20 pushes, from whoever
  // pushes them.
  const std::string base = kAsync + " --set train.max_steps=10 --set runtime.slowdown.rank=1" +
                           " --set runtime.slowdown.factor=3";
  SECTION("no bound: the fast worker takes more of the run's pushes than the straggler") {
    TempDir dir("budget");
    Outcome o = run_command(small_cifar_command(3, dir.path, base + " --set sync.max_staleness=-1"));
    INFO(o.output);
    REQUIRE(o.exit_code == 0);
    PushCounts c = push_counts(dir.path / "comm/rank2.jsonl");
    CHECK(c.per_worker[0] + c.per_worker[1] == 20);
    CHECK(c.per_worker[0] > c.per_worker[1]);
    // Both workers stop at the final meet and write the same global step's checkpoint.
    CHECK(fs::exists(dir.path / "checkpoints/step_10/rank1.state"));
  }
  SECTION("s = 1: in the server's push order the counts never differ by more than s + 1") {
    // Worker 0 is granted step c only while c - (steps worker 1 has pushed) <= s.
    TempDir dir("ssp");
    Outcome o = run_command(small_cifar_command(3, dir.path, base + " --set sync.max_staleness=1"));
    INFO(o.output);
    REQUIRE(o.exit_code == 0);
    PushCounts c = push_counts(dir.path / "comm/rank2.jsonl");
    CHECK(c.per_worker[0] + c.per_worker[1] == 20);
    CHECK(c.widest <= 2);
    // The summary counts every rank's pushes and pulls (one server: one pull per push).
    const std::string r0 = std::to_string(c.per_worker[0]), r1 = std::to_string(c.per_worker[1]);
    CHECK_THAT(o.output, Contains("PUSH_GRAD/PULL_PARAMS: r0 " + r0 + "/" + r0 + " r1 " + r1 + "/" + r1 + " r2 20/20"));
  }
}

TEST_CASE("async_ps: a killed server ends the job (no hang)", "[mpi][async_ps][failure]") {
  TempDir dir("ps_killed");
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    execl("/bin/sh", "sh", "-c",
          (small_cifar_command(3, dir.path, kAsync + " --set train.max_steps=2000") + " > /dev/null 2>&1").c_str(),
          nullptr);
    _exit(127);
  }
  const fs::path metrics = dir.path / "metrics.jsonl";
  for (int i = 0; i < 6000 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(fs::exists(metrics));
  // The server is world rank 2: the descendant of the job whose environment says so (Open MPI puts
  // each rank in a process group of its own, so the job's group does not find them).
  pid_t victim = 0;
  std::vector<pid_t> family{pid};
  for (size_t i = 0; i < family.size(); ++i) {
    std::FILE* children = popen(("pgrep -P " + std::to_string(family[i])).c_str(), "r");
    REQUIRE(children);
    for (int child = 0; std::fscanf(children, "%d", &child) == 1;) family.push_back(child);
    pclose(children);
  }
  for (pid_t candidate : family) {
    std::ifstream env("/proc/" + std::to_string(candidate) + "/environ");
    const std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (all.find(std::string("OMPI_COMM_WORLD_RANK=2") + '\0') != std::string::npos) victim = candidate;
  }
  REQUIRE(victim > 0);
  kill(victim, SIGKILL);
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) kill(-pid, SIGKILL), waitpid(pid, &status, 0);
  CHECK(done == pid);  // the job ended by itself ...
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);  // ... as a failure
}

TEST_CASE("async_ps: an error on a worker ends every rank, servers included, promptly", "[mpi][async_ps][failure]") {
  TempDir dir("ps_failure");
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = run_command(small_cifar_command(3, dir.path, kAsync + " --set train.max_steps=30 --inject-failure 1:5"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(o.output);
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("rank 1 of 3") && Contains("injected failure at step 5"));
  CHECK(seconds < 120);
}

TEST_CASE("async_ps: bad settings are one clear error naming the key", "[mpi][async_ps][config]") {
  TempDir dir("ps_config");
  SECTION("no rank left to be a worker") {
    Outcome o = run_command(small_cifar_command(2, dir.path, " --set sync.method=async_ps --set sync.async_ps.servers=2"));
    INFO(o.output);
    CHECK(o.exit_code == 1);
    CHECK_THAT(o.output, Contains("sync.async_ps.servers = 2 must be at least 1 and below the number of processes (2)"));
    // Every rank found it, one printed it.
    size_t count = 0;
    for (size_t at = o.output.find("sync.async_ps.servers = 2"); at != std::string::npos;
         at = o.output.find("sync.async_ps.servers = 2", at + 1))
      ++count;
    CHECK(count == 1);
  }
  SECTION("unknown staleness rule") {
    Outcome o = run_command(small_cifar_command(2, dir.path, kAsync + " --set sync.staleness_lr=sqrt"));
    INFO(o.output);
    CHECK(o.exit_code == 1);
    CHECK_THAT(o.output, Contains("staleness_lr") && Contains("inverse"));
  }
}
