// The trainer program under mpiexec: bit-identical resume (stopped between checkpoints, on a
// checkpoint, and killed with SIGKILL), damaged and mismatched checkpoints, the comm log of dense
// sync, and failure behaviour (an error or a killed process on one rank ends the whole job).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/sync/methods/dense/gradient_buckets.h"
#include "comm/sync/gradient_sync.h"
#include "trainer/tasks/task.h"
#include "cifar_runs.h"
#include "process.h"
#include "resume_runs.h"

namespace fs = std::filesystem;
namespace comm = trainer::comm;
namespace models = trainer::models;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

Outcome run(const std::string& command) { return run_command(command); }

// ResNet-20 at batch 8 per rank on 640 images (tests/cifar_runs.h).
std::string trainer_command(int ranks, const fs::path& out, const std::string& extra) {
  return trainer::testing::small_cifar_command(ranks, out, "" + extra);
}
using trainer::testing::rank_states;
using trainer::testing::require_identical_states;
using trainer::testing::ResumedRun;
using trainer::testing::small_cifar_on;

}  // namespace

TEST_CASE("Resume is bit-identical: between checkpoints, on a checkpoint, every sync method", "[mpi][resume]") {
  // Checkpoints at steps 5 and 10 fall in the compressed phase (dense warmup: 2 steps), so the
  // compressed methods' residuals, thresholds, region bounds and PowerSGD's Q must come back exactly.
  const int P = 2;
  for (const std::string& method : trainer::comm::sync_method_names()) {
    SECTION(method) {
      const std::string sync = "--set sync.method=" + method + " --set sync.period=3 --set sync.dense_warmup_steps=2" +
                               " --set sync.density=0.02 --set train.max_steps=16 --set train.checkpoint_every=5";
      TempDir ref("ref_" + method);
      REQUIRE(run(trainer_command(P, ref.path, sync)).exit_code == 0);
      for (int stop : {7, 10}) {  // 7: between checkpoints 5 and 10; 10: on one
        const ResumedRun part(small_cifar_on(P, sync), stop);
        require_identical_states(ref.path / "checkpoints/step_16", part.dir.path / "checkpoints/step_16", P);
      }
    }
  }
}

TEST_CASE("Resume is bit-identical across a switch of sync.adaptive", "[mpi][resume]") {
  // Intervals of 3 steps after 2 dense ones: steps 2-8 at the low-compression setting (the interval
  // that ends with step 2 ran one compressed step, no measurement; 3-5 is the first measured one; 6-8
  // has nothing to compare with); a threshold no change reaches (eta = 5) then sends steps 9-15 at the
  // high one, so the runs resumed from steps 5 and 10 cross the switch after step 8 or run past it.
  const int P = 2;
  for (const std::string method : {"powersgd", "oktopk"}) {
    SECTION(method) {
      const std::string sync = "--set sync.method=" + method + " --set sync.dense_warmup_steps=2" +
                               " --set sync.adaptive=true --set sync.adaptive_interval=3"
                               " --set sync.adaptive_threshold=5 --set sync.rank=1 --set sync.density=0.02"
                               " --set train.max_steps=16 --set train.checkpoint_every=5 --set train.log_every_steps=1";
      TempDir ref("ref_adaptive_" + method);
      REQUIRE(run(trainer_command(P, ref.path, sync)).exit_code == 0);
      // The switch in the comm log (every rank) and in the metrics.
      for (int r = 0; r < P; ++r) {
        std::ifstream log(ref.path / ("comm/rank" + std::to_string(r) + ".jsonl"));
        std::vector<int64_t> switches;
        for (std::string line; std::getline(log, line);) {
          const auto rec = nlohmann::json::parse(line);
          if (rec.value("op", "") == "ADAPTIVE_SWITCH") switches.push_back(rec["step"].get<int64_t>());
        }
        CHECK(switches == std::vector<int64_t>{8});
      }
      std::ifstream metrics(ref.path / "metrics.jsonl");
      std::map<int64_t, double> low;
      for (std::string line; std::getline(metrics, line);) {
        const auto rec = nlohmann::json::parse(line);
        if (rec.contains("low_compression")) low[rec["step"].get<int64_t>()] = rec["low_compression"].get<double>();
      }
      CHECK(low[9] == 1.0);   // the record of step 8 (records count the steps done)
      CHECK(low[10] == 0.0);  // step 9
      for (int stop : {7, 10}) {
        const ResumedRun part(small_cifar_on(P, sync), stop);
        require_identical_states(ref.path / "checkpoints/step_16", part.dir.path / "checkpoints/step_16", P);
      }
    }
  }
}

TEST_CASE("Resume is bit-identical with sync.dgc and the sparsity warm-up", "[mpi][resume][dgc]") {
  // DGC's velocity (comm/sync/wrappers/dgc.h) follows the residual in the state; the warm-up's densities
  // (steps 0-3 at 0.2, 4-7 at 0.093, 8-11 at 0.043, then 0.02) switch after steps 7 and 11, so the
  // runs resumed from steps 7 and 10 start mid-stage and cross a switch. Local clipping binds.
  const int P = 2;
  for (const std::string method : {"topka", "oktopk"}) {
    SECTION(method) {
      const std::string sync = "--set sync.method=" + method + " --set sync.dense_warmup_steps=2" +
                               " --set sync.dgc=true --set sync.density=0.02 --set sync.density_warmup_steps=12"
                               " --set sync.density_warmup_stages=3 --set sync.density_warmup_start=0.2"
                               " --set optim.grad_clip_norm=0.5 --set train.max_steps=16"
                               " --set train.checkpoint_every=5 --set train.log_every_steps=1";
      TempDir ref("ref_dgc_" + method);
      const Outcome reference = run(trainer_command(P, ref.path, sync));
      INFO(reference.output);
      REQUIRE(reference.exit_code == 0);
      std::ifstream metrics(ref.path / "metrics.jsonl");
      std::map<int64_t, double> target;
      for (std::string line; std::getline(metrics, line);) {
        const auto rec = nlohmann::json::parse(line);
        if (rec.contains("density_target")) target[rec["step"].get<int64_t>()] = rec["density_target"].get<double>();
      }
      CHECK(target.count(2) == 0);  // steps 0 and 1: dense
      CHECK(target[4] == Approx(0.2));   // the record of step 3
      CHECK(target[5] == Approx(0.2 * std::pow(0.1, 1.0 / 3)));
      CHECK(target[12] == Approx(0.2 * std::pow(0.1, 2.0 / 3)));
      CHECK(target[13] == Approx(0.02));
      for (int stop : {7, 10}) {
        const ResumedRun part(small_cifar_on(P, sync), stop);
        require_identical_states(ref.path / "checkpoints/step_16", part.dir.path / "checkpoints/step_16", P);
        if (stop == 10) {
          Outcome plain = run(trainer_command(P, part.dir.path, sync + " --set sync.dgc=false --resume latest"));
          // The optimizer's state is read first: with sync.<method>.dgc it kept no momentum buffer.
          CHECK(plain.exit_code != 0);
          CHECK_THAT(plain.output, Contains("momentum buffer of 0 elements"));
        }
      }
    }
  }
}

TEST_CASE("Resume is bit-identical with adam and adamw, and another optimizer's state is a clear error", "[mpi][resume]") {
  // Adam's state is its moments and the step count (the bias corrections depend on it). adamw runs
  // under local_sgd, where every rank steps its own optimizer, so each rank's state must come back.
  const int P = 2;
  for (const auto& [optimizer, method] : {std::pair<std::string, std::string>{"adam", "dense"}, {"adamw", "local_sgd"}}) {
    SECTION(optimizer) {
      const std::string args = "--set optim.name=" + optimizer + " --set optim.lr=0.001 --set optim.weight_decay=0.01" +
                               " --set sync.method=" + method + " --set sync.period=3" +
                               " --set train.max_steps=12 --set train.checkpoint_every=5";
      TempDir ref("ref_" + optimizer);
      Outcome full = run(trainer_command(P, ref.path, args));
      INFO(full.output);
      REQUIRE(full.exit_code == 0);
      // The state is Adam's: magic "TADM", then version, n, step, two lengths, m and v.
      const auto states = rank_states(ref.path / "checkpoints/step_12", P);
      const auto& blob = states.at("rank1.state/optimizer_state");
      REQUIRE(blob.size() > 40);
      CHECK(std::string(blob.begin(), blob.begin() + 4) == "TADM");

      const ResumedRun part(small_cifar_on(P, args), 7);
      require_identical_states(ref.path / "checkpoints/step_12", part.dir.path / "checkpoints/step_12", P);

      if (optimizer == "adam") {
        Outcome other = run(trainer_command(P, part.dir.path, args + " --set optim.name=sgd --resume latest"));
        CHECK(other.exit_code != 0);
        CHECK_THAT(other.output, Contains("Adam optimizer state") && Contains("optim.name"));
      }
    }
  }
}

TEST_CASE("A job killed with SIGKILL resumes from latest bit-identically", "[mpi][resume]") {
  const int P = 2;
  const std::string sync = "--set train.max_steps=30 --set train.checkpoint_every=4";
  TempDir ref("kill_ref");
  REQUIRE(run(trainer_command(P, ref.path, sync)).exit_code == 0);

  TempDir part("kill_part");
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();  // its own process group, so the kill reaches mpiexec and every rank
    execl("/bin/sh", "sh", "-c", (trainer_command(P, part.path, sync) + " > /dev/null 2>&1").c_str(), nullptr);
    _exit(127);
  }
  const fs::path marker = part.path / "checkpoints/step_12/manifest.json";
  for (int i = 0; i < 6000 && !fs::exists(marker); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(fs::exists(marker));
  kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  // mpiexec may have put the ranks in process groups of their own: kill every process of this job
  // (they all carry the output folder on their command line) and wait until none is left, so no
  // orphan keeps writing checkpoints beside the resumed job.
  // ("[t]rainer" matches "trainer" but not the shell running pgrep, whose command line holds "[t]")
  const std::string pattern = "'[t]rainer .*" + part.path.string() + "'";
  for (int i = 0; i < 500; ++i) {
    std::system(("pkill -9 -f " + pattern + " > /dev/null 2>&1").c_str());
    if (std::system(("pgrep -f " + pattern + " > /dev/null 2>&1").c_str()) != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fs::exists(part.path / "checkpoints"));
  CHECK_FALSE(fs::exists(part.path / "checkpoints/step_30"));

  Outcome resumed = run(trainer_command(P, part.path, sync + " --resume latest"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  require_identical_states(ref.path / "checkpoints/step_30", part.path / "checkpoints/step_30", P);
}

TEST_CASE("A checkpoint written at one ISA resumes at another (AVX2 and this machine's own)", "[mpi][resume]") {
  // The weights keep PyTorch's layout whatever layouts the kernels use (nChw16c on AVX-512, nChw8c
  // on AVX2), so a checkpoint moves between machines of either kind. ONEDNN_MAX_CPU_ISA=AVX2 plays
  // the AVX2 machine. Different kernels round differently, so a run resumed at the other ISA is not
  // bit-identical to the run continued at its first ISA; how far apart kernel rounding alone takes
  // two runs is measured here, by the same 16 steps at each ISA from the start. The mixed run (8
  // steps at one ISA, 8 at the other) shares its first 8 steps with the straight run at its first
  // ISA, so it may differ from it by at most what 16 steps at the two ISAs differ by, with half
  // again as margin (rounding differences grow with the steps they act on, so about the same or
  // less is expected). A checkpoint read in the wrong layout would put the mixed run as far from
  // both as training moves the weights. On an AVX2 machine both ISAs are one, the two straight
  // runs are the same bits, and so must the mixed one be.
  const int P = 2;
  const double margin = 1.5;
  const std::string avx2 = "env ONEDNN_MAX_CPU_ISA=AVX2 TRAINER_DNNL_VERBOSE=1 ";
  const std::string steps = "--set train.max_steps=16 --set train.checkpoint_every=8";
  auto weights = [](const fs::path& checkpoint) {
    std::vector<double> all;
    for (const auto& t : trainer::models::read_safetensors((checkpoint / "model.safetensors").string()).tensors)
      for (double v : t.as_f64()) all.push_back(v);
    return all;
  };
  auto distance = [](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(d);
  };
  TempDir native_dir("isa_straight_native"), avx2_dir("isa_straight_avx2");
  REQUIRE(run(trainer_command(P, native_dir.path, steps)).exit_code == 0);
  const Outcome capped = run(avx2 + trainer_command(P, avx2_dir.path, steps));
  INFO(capped.output);
  REQUIRE(capped.exit_code == 0);
  CHECK_THAT(capped.output, Contains("jit:avx2"));  // the cap took effect
  const auto straight_native = weights(native_dir.path / "checkpoints/step_16"),
             straight_avx2 = weights(avx2_dir.path / "checkpoints/step_16");
  const double kernels_apart = distance(straight_native, straight_avx2);
  for (const bool first_capped : {false, true}) {
    INFO((first_capped ? "written at AVX2, resumed natively" : "written natively, resumed at AVX2"));
    const std::string first_isa = first_capped ? avx2 : "", second_isa = first_capped ? "" : avx2;
    const auto at_isa = [&](const std::string& isa) {
      return [&, isa](const fs::path& out, const std::string& extra) {
        return isa + trainer_command(P, out, steps + extra);
      };
    };
    const ResumedRun part(at_isa(first_isa), 8, at_isa(second_isa));
    const auto& straight = first_capped ? straight_avx2 : straight_native;
    const auto at8 = weights(part.dir.path / "checkpoints/step_8"),
               mixed = weights(part.dir.path / "checkpoints/step_16");
    const double mixed_apart = distance(mixed, straight), trained = distance(at8, straight);
    INFO("mixed run from the straight one " << mixed_apart << "; the straight runs at the two ISAs " << kernels_apart
                                            << "; steps 8-16 moved the weights " << trained);
    CHECK(distance(mixed, at8) > 0);  // the resumed run trained on
    // The bound means something only while rounding moves two runs apart less than training moves
    // the weights in 8 steps.
    CHECK(kernels_apart < trained);
    CHECK(mixed_apart <= margin * kernels_apart);
  }
}

TEST_CASE("Damaged, mismatched and foreign checkpoints are clear errors and latest falls back", "[mpi][resume]") {
  const int P = 2;
  const std::string base = "--set train.max_steps=8 --set train.checkpoint_every=4 --set train.keep_checkpoints=3";
  TempDir dir("damaged");
  REQUIRE(run(trainer_command(P, dir.path, base)).exit_code == 0);
  const fs::path newest = dir.path / "checkpoints/step_8";
  REQUIRE(fs::exists(newest / "manifest.json"));
  fs::resize_file(newest / "rank1.state", fs::file_size(newest / "rank1.state") / 2);

  Outcome explicit_damaged = run(trainer_command(P, dir.path, base + " --resume " + newest.string()));
  CHECK(explicit_damaged.exit_code != 0);
  CHECK_THAT(explicit_damaged.output, Contains("rank1.state"));

  Outcome latest = run(trainer_command(P, dir.path, base + " --set train.max_steps=10 --resume latest"));
  INFO(latest.output);
  CHECK(latest.exit_code == 0);
  CHECK_THAT(latest.output, Contains("step_8") && Contains("step_4"));  // the warning names both
  // (that run trains on and writes a clean step_8 and a step_10)

  // Another world size resumes (elastic_e2e_test checks what it keeps).
  Outcome world = run(trainer_command(1, dir.path, base + " --resume " + (dir.path / "checkpoints/step_4").string()));
  CHECK(world.exit_code == 0);
  CHECK_THAT(world.output, Contains("re-sharded from 2 to 1 process: global batch 16 kept"));

  Outcome foreign = run(trainer_command(P, dir.path, base + " --set model.arch=resnet32 --resume " +
                                                          (dir.path / "checkpoints/step_4").string()));
  CHECK(foreign.exit_code != 0);
  CHECK_THAT(foreign.output, Contains("step_4"));
}

TEST_CASE("The comm log of dense sync: one allreduce per bucket per step, bytes = bucket sizes", "[mpi][commlog]") {
  const int P = 3;
  TempDir dir("commlog");
  // ResNet-20 has 269,722 parameters = 1,078,888 bytes; 0.4 MB buckets (100,000 floats) of whole
  // tensors in backward order, the first closed at 0.1 MB: the plan gradient_buckets.h makes.
  Outcome o = run(trainer_command(P, dir.path, "--set train.max_steps=6 --set sync.bucket_mb=0.4"
                                               " --set sync.first_bucket_mb=0.1"));
  INFO(o.output);
  REQUIRE(o.exit_code == 0);
  std::vector<models::ParamView> views;
  trainer::Config config;
  config.model.arch = "resnet20";
  const int64_t n = trainer::app::model_parameter_count(config, &views);
  REQUIRE(n == 269722);
  std::vector<int64_t> planned;
  for (const comm::GradientBucket& b : comm::plan_gradient_buckets(n, &views, 100000, 25000))
    planned.push_back(b.size() * 4);
  REQUIRE(planned.size() >= 4);
  CHECK(std::accumulate(planned.begin(), planned.end(), int64_t{0}) == n * 4);
  for (int r = 0; r < P; ++r) {
    std::ifstream log(dir.path / ("comm/rank" + std::to_string(r) + ".jsonl"));
    REQUIRE(log);
    std::map<int64_t, std::vector<int64_t>> per_step;
    std::map<int64_t, int64_t> backward_end;
    std::string line;
    while (std::getline(log, line)) {
      auto rec = nlohmann::json::parse(line);
      if (rec["op"] == "FORWARD_BACKWARD") {
        CHECK(rec["kind"] == "compute");
        backward_end[rec["step"].get<int64_t>()] = rec["t_end_us"].get<int64_t>();
      }
      if (rec["op"] != "ALLREDUCE_DENSE") continue;
      CHECK(rec["phase"] == "dense");
      CHECK(rec["peer"] == -1);
      CHECK(rec["bytes"] == rec["bytes_recv"]);
      // Overlapped (sync.overlap's default): each bucket went out once it was final.
      REQUIRE(rec.contains("ready_us"));
      CHECK(rec["ready_us"].get<int64_t>() <= rec["t_start_us"].get<int64_t>());
      per_step[rec["step"].get<int64_t>()].push_back(rec["bytes"].get<int64_t>());
    }
    CHECK(per_step.size() == 6);
    CHECK(backward_end.size() == 6);
    for (const auto& [step, sizes] : per_step) CHECK(sizes == planned);
  }
  CHECK(fs::exists(dir.path / "comm/summary.txt"));
  CHECK_THAT(o.output, Contains("ALLREDUCE_DENSE"));
}

TEST_CASE("An error on one rank ends every rank promptly with one message", "[mpi][failure]") {
  TempDir dir("failure");
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = run(trainer_command(3, dir.path, "--set train.max_steps=20 --inject-failure 1:5"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(o.output);
  CHECK(o.exit_code != 0);
  CHECK_THAT(o.output, Contains("rank 1 of 3") && Contains("injected failure at step 5"));
  CHECK(seconds < 120);
}

TEST_CASE("A rank killed by a signal ends the job (no hang)", "[mpi][failure]") {
  TempDir dir("killed_rank");
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    execl("/bin/sh", "sh", "-c",
          (trainer_command(2, dir.path, "--set train.max_steps=2000 --set train.checkpoint_every=0") +
           " > /dev/null 2>&1").c_str(),
          nullptr);
    _exit(127);
  }
  // Wait for training to be under way, then kill one rank (a trainer process, not mpiexec).
  const fs::path metrics = dir.path / "metrics.jsonl";
  for (int i = 0; i < 6000 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(fs::exists(metrics));
  const std::string find = "pgrep -g " + std::to_string(pid) + " -f 'trainer --config' | tail -1";
  std::FILE* p = popen(find.c_str(), "r");
  int victim = 0;
  REQUIRE(std::fscanf(p, "%d", &victim) == 1);
  pclose(p);
  kill(victim, SIGKILL);
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) kill(-pid, SIGKILL), waitpid(pid, &status, 0);
  CHECK(done == pid);  // the job ended by itself
}

TEST_CASE("Wait split in the comm log and a Chrome trace of a step window", "[mpi][commlog][trace]") {
  const int P = 3;
  TempDir dir("trace");
  Outcome o = run(trainer_command(P, dir.path,
                                  "--set train.max_steps=6 --set sync.method=oktopk --set sync.density=0.02"
                                  " --set sync.dense_warmup_steps=2 --set comm.trace_first_step=1"
                                  " --set comm.trace_steps=3"));
  INFO(o.output);
  REQUIRE(o.exit_code == 0);
  // Per rank: the records of the trace window (steps 1..3), and every collective's wait in order.
  std::vector<std::map<std::string, int64_t>> window_ops(P);
  std::vector<std::vector<int64_t>> waits(P);
  for (int r = 0; r < P; ++r) {
    std::ifstream log(dir.path / ("comm/rank" + std::to_string(r) + ".jsonl"));
    REQUIRE(log);
    std::string line;
    while (std::getline(log, line)) {
      const auto rec = nlohmann::json::parse(line);
      if (rec.value("kind", "") == "compute") continue;  // the step's FORWARD_BACKWARD interval, not a message
      const int64_t step = rec["step"].get<int64_t>();
      if (step >= 1 && step <= 3) window_ops[r][rec["op"].get<std::string>()] += 1;
      const int64_t duration = rec["t_end_us"].get<int64_t>() - rec["t_start_us"].get<int64_t>();
      if (rec["peer"] == -1) {
        REQUIRE(rec.contains("wait_us"));
        const int64_t wait = rec["wait_us"].get<int64_t>();
        CHECK(wait >= 0);
        CHECK(wait <= duration);
        CHECK(wait + rec["transfer_us"].get<int64_t>() == duration);
        waits[r].push_back(wait);
      } else {
        CHECK_FALSE(rec.contains("wait_us"));  // point to point has no last rank
      }
    }
  }
  // Collectives match by call order; the last rank to enter one waited exactly 0 in it.
  for (int r = 1; r < P; ++r) REQUIRE(waits[r].size() == waits[0].size());
  REQUIRE_FALSE(waits[0].empty());
  int calls_without_a_last_rank = 0;
  for (size_t i = 0; i < waits[0].size(); ++i) {
    int64_t least = waits[0][i];
    for (int r = 1; r < P; ++r) least = std::min(least, waits[r][i]);
    if (least != 0) ++calls_without_a_last_rank;
  }
  CHECK(calls_without_a_last_rank == 0);

  std::ifstream f(dir.path / "trace.json");
  REQUIRE(f);
  const auto trace = nlohmann::json::parse(f);  // throws (fails the test) on invalid JSON
  std::vector<std::map<std::string, int64_t>> traced_ops(P);
  std::vector<std::map<std::string, int64_t>> phases(P);
  for (const auto& e : trace.at("traceEvents")) {
    if (e["ph"] != "X") continue;
    const int pid = e["pid"].get<int>();
    REQUIRE(pid >= 0);
    REQUIRE(pid < P);
    CHECK(e["dur"].get<int64_t>() >= 0);
    if (e["cat"] == "comm") {
      traced_ops[pid][e["name"].get<std::string>()] += 1;
      CHECK(e["args"].contains("bytes"));
      CHECK(e["args"]["step"].get<int64_t>() >= 1);
      CHECK(e["args"]["step"].get<int64_t>() <= 3);
      CHECK(e["args"].contains("wait_us") == (e["args"]["peer"] == -1));
    } else {
      phases[pid][e["name"].get<std::string>()] += 1;
    }
  }
  for (int r = 0; r < P; ++r) {
    CHECK(traced_ops[r] == window_ops[r]);  // one event per logged op of the window
    for (const char* name : {"step", "data", "forward_backward", "sync", "optimizer", "after_step"})
      CHECK(phases[r][name] == 3);
  }
  CHECK(window_ops[0].count("ALLREDUCE_DENSE") == 1);  // step 1 is dense warmup
  CHECK_THAT(o.output, Contains("wait per rank in collectives"));
}
