// The trainer program under faults: a stop signal to one rank (checkpoint, exit status, bit-identical
// resume), a second signal, a NaN injected on one rank (error, or the step skipped on every rank),
// and checkpoint writes that fail for lack of space (a warning while training, the previous
// checkpoint kept for --resume latest, metrics never corrupted).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cifar_runs.h"
#include "process.h"
#include "skip.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using trainer::testing::Outcome;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

// ResNet-20 at batch 8 per rank on 640 images (tests/cifar_runs.h).
std::string trainer_command(int ranks, const fs::path& out, const std::string& extra) {
  return trainer::testing::small_cifar_command(ranks, out, "--set train.log_every_steps=2 " + extra);
}
using trainer::testing::rank_states;
using trainer::testing::require_identical_states;

// A job started in the background, in a process group of its own.
struct Job {
  pid_t pid = -1;
  fs::path log;
  Job(const std::string& command, const fs::path& log_file) : log(log_file) {
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setsid();
      execl("/bin/sh", "sh", "-c", (command + " > " + log.string() + " 2>&1").c_str(), nullptr);
      _exit(127);
    }
  }
  // The exit status (as the shell reports it), killing the job after `seconds`.
  int wait(int seconds = 300) {
    int status = 0;
    const auto t0 = std::chrono::steady_clock::now();
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(seconds))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done == 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL("job did not end within " << seconds << " s");
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output() const {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

// The pid of one rank of the trainer job writing to `out`: a process whose command line starts with
// the trainer binary (not mpiexec's) and whose environment says OMPI_COMM_WORLD_RANK=rank.
pid_t rank_pid(const fs::path& out, int rank) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string name = entry.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream cmd(entry.path() / "cmdline"), env(entry.path() / "environ");
      std::string cmdline((std::istreambuf_iterator<char>(cmd)), {}), environ((std::istreambuf_iterator<char>(env)), {});
      if (cmdline.rfind(TRAINER_BINARY, 0) != 0 || cmdline.find(out.string()) == std::string::npos) continue;
      if (environ.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
        return static_cast<pid_t>(std::stoi(name));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Waits until the job has logged its first metrics (training is under way).
void wait_for_training(const fs::path& out) {
  const fs::path metrics = out / "metrics.jsonl";
  for (int i = 0; i < 30000 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(fs::exists(metrics));
}

std::vector<fs::path> checkpoints(const fs::path& out) {
  std::vector<fs::path> all;
  if (fs::exists(out / "checkpoints"))
    for (const auto& e : fs::directory_iterator(out / "checkpoints")) all.push_back(e.path());
  return all;
}

}  // namespace

TEST_CASE("A stop signal to one rank: every rank checkpoints, exits 143/130, resume is bit-identical",
          "[mpi][signals]") {
  // Ok-Top-k after 2 dense steps: error-feedback residuals and thresholds must come back exactly.
  const int P = 3;
  const std::string args = "--set sync.method=oktopk --set sync.dense_warmup_steps=2 --set sync.density=0.02"
                           " --set train.epochs=2 --set train.max_steps=40 --set train.checkpoint_every=100";
  TempDir ref("signal_ref");
  Outcome full = run_command(trainer_command(P, ref.path, args));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);

  for (const auto& [rank, sig] : {std::pair<int, int>{0, SIGTERM}, {2, SIGINT}}) {
    SECTION("rank " + std::to_string(rank) + (sig == SIGTERM ? " SIGTERM" : " SIGINT")) {
      TempDir part("signal_part" + std::to_string(rank));
      Job job(trainer_command(P, part.path, args), part.path.string() + ".log");
      wait_for_training(part.path);
      const pid_t victim = rank_pid(part.path, rank);
      REQUIRE(victim > 0);
      kill(victim, sig);
      const int status = job.wait();
      const std::string output = job.output();
      fs::remove(job.log);
      INFO(output);
      CHECK(status == 128 + sig);
      CHECK_THAT(output, Contains(sig == SIGTERM ? "stopped by SIGTERM after step" : "stopped by SIGINT after step") &&
                             Contains("--resume latest"));
      // One checkpoint, written at the stop (the schedule has none before step 40).
      const auto written = checkpoints(part.path);
      REQUIRE(written.size() == 1);
      CHECK(fs::exists(written[0] / "manifest.json"));
      CHECK(written[0].filename() != "step_40");

      Outcome resumed = run_command(trainer_command(P, part.path, args + " --resume latest"));
      INFO(resumed.output);
      REQUIRE(resumed.exit_code == 0);
      CHECK_THAT(resumed.output, Contains("resumed from " + written[0].string()));
      require_identical_states(ref.path / "checkpoints/step_40", part.path / "checkpoints/step_40", P);
    }
  }
}

TEST_CASE("A second stop signal ends the job at once, without a checkpoint", "[mpi][signals]") {
  TempDir dir("second_signal");
  Job job(trainer_command(2, dir.path, "--set train.max_steps=2000 --set train.checkpoint_every=0"),
          dir.path.string() + ".log");
  wait_for_training(dir.path);
  const pid_t victim = rank_pid(dir.path, 1);
  REQUIRE(victim > 0);
  // Two different signals: two of one kind sent at once may merge into one delivery. Both arrive
  // long before the next step's control allreduce could act on the first.
  kill(victim, SIGTERM);
  kill(victim, SIGINT);
  const int status = job.wait(120);
  const std::string output = job.output();
  fs::remove(job.log);
  INFO(output);
  CHECK(status != 0);
  CHECK_THAT(output, Contains("second signal"));
  CHECK(checkpoints(dir.path).empty());
}

TEST_CASE("A NaN on one rank is an error on every rank in the same step, naming the step and tensor",
          "[mpi][nonfinite]") {
  const int P = 2;
  TempDir dir("nan_error");
  const std::string args = "--set train.max_steps=12 --set train.checkpoint_every=4";
  Outcome o = run_command("env TRAINER_TEST_INJECT_NAN=1:5 " + trainer_command(P, dir.path, args));
  INFO(o.output);
  CHECK(o.exit_code == 3);
  CHECK_THAT(o.output, Contains("non-finite value at step 5: the gradient of linear.bias on rank 1, before the "
                                "gradient sync") &&
                           Contains("train.skip_nonfinite_steps") && Contains("checkpoints/step_4"));
  // Every rank stopped in the same step and only rank 0 reported it: one error line, no abort.
  size_t errors = 0;
  for (size_t at = o.output.find("error:"); at != std::string::npos; at = o.output.find("error:", at + 1)) ++errors;
  CHECK(errors == 1);
  CHECK(fs::exists(dir.path / "checkpoints/step_4/manifest.json"));
  CHECK_FALSE(fs::exists(dir.path / "checkpoints/step_8"));

  // The last good checkpoint is intact: resuming without the NaN trains to the end.
  Outcome resumed = run_command(trainer_command(P, dir.path, args + " --resume latest"));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + (dir.path / "checkpoints/step_4").string()));
}

TEST_CASE("skip_nonfinite_steps: the step is skipped on every rank, leaving no trace, and too many is an error",
          "[mpi][nonfinite]") {
  // Ok-Top-k (after 2 dense steps) keeps error-feedback residuals: a NaN must not reach them.
  const int P = 2;
  const std::string args = "--set sync.method=oktopk --set sync.dense_warmup_steps=2 --set sync.density=0.02"
                           " --set train.skip_nonfinite_steps=2 --set train.max_steps=8 --set train.checkpoint_every=1"
                           " --set train.keep_checkpoints=100";
  TempDir dir("nan_skip");
  Outcome o = run_command("env TRAINER_TEST_INJECT_NAN=1:5 " + trainer_command(P, dir.path, args));
  INFO(o.output);
  REQUIRE(o.exit_code == 0);
  CHECK_THAT(o.output, Contains("non-finite value at step 5") && Contains("step skipped on every rank (1 in a row)"));
  // Step 5 (the 6th) changed nothing on any rank: weights, BN statistics, optimizer and sync state
  // after it equal those before it, while the steps around it did change them.
  const auto s5 = rank_states(dir.path / "checkpoints/step_5", P), s6 = rank_states(dir.path / "checkpoints/step_6", P);
  const auto s4 = rank_states(dir.path / "checkpoints/step_4", P), s7 = rank_states(dir.path / "checkpoints/step_7", P);
  for (int r = 0; r < P; ++r) {
    for (const std::string t : {"params", "buffers", "optimizer_state", "sync_state"}) {
      const std::string name = "rank" + std::to_string(r) + ".state/" + t;
      INFO(name);
      const bool unchanged = s5.at(name) == s6.at(name);
      CHECK(unchanged);
    }
    const std::string params = "rank" + std::to_string(r) + ".state/params";
    CHECK(s4.at(params) != s5.at(params));
    CHECK(s6.at(params) != s7.at(params));
  }
  // The control allreduce ran at the skipped step (8 bytes), the sparse sync did not.
  std::ifstream log(dir.path / "comm/rank1.jsonl");
  std::map<std::string, int> ops_at_5;
  int control = 0;
  for (std::string line; std::getline(log, line);) {
    const auto rec = nlohmann::json::parse(line);
    if (rec.value("kind", "") == "compute") continue;  // the step's FORWARD_BACKWARD interval, not a message
    if (rec["op"] == "ALLREDUCE_CONTROL") {
      ++control;
      CHECK(rec["bytes"] == 8);
    }
    const std::string op = rec["op"];
    if (rec["step"] == 5 && op.rfind("CHECKPOINT", 0) != 0) ops_at_5[op] += 1;  // (step_6 is written at 5)
  }
  CHECK(control == 8);
  CHECK(ops_at_5.size() == 1);
  CHECK(ops_at_5.count("ALLREDUCE_CONTROL") == 1);

  // Three in a row with a limit of two: an error at the third.
  TempDir again("nan_skip_limit");
  Outcome limit = run_command("env TRAINER_TEST_INJECT_NAN=1:3,0:4,1:5 " + trainer_command(P, again.path, args));
  INFO(limit.output);
  CHECK(limit.exit_code == 3);
  CHECK_THAT(limit.output, Contains("non-finite value at step 5") &&
                               Contains("more than train.skip_nonfinite_steps = 2 steps in a row") &&
                               Contains("checkpoints/step_5"));
}

TEST_CASE("A full disk: failed checkpoints warn while training, the final one is an error, latest finds the last "
          "complete one and metrics stay whole",
          "[mpi][diskfull]") {
  // The output folder on a 32 MB tmpfs (privileged), or else the job under a file size limit that
  // rank state files (2.2 MB) exceed and everything else fits (ulimit -f, in KiB under bash). With
  // neither, the case is skipped before any run.
  TempDir dir("disk_full");
  const fs::path out = dir.path / "out";
  fs::create_directories(out);
  const bool tmpfs = mount("tmpfs", out.c_str(), "tmpfs", 0, "size=32m") == 0;
  if (!tmpfs && std::system("bash -c 'ulimit -f 1500' > /dev/null 2>&1") != 0) {
    fs::remove_all(dir.path);  // skip_test exits without unwinding
    trainer::testing::skip_test("neither a tmpfs mount nor ulimit -f is available here");
  }
  struct Unmount {
    fs::path at;
    bool mounted;
    ~Unmount() {
      if (mounted) umount2(at.c_str(), MNT_DETACH);
    }
  } unmount{out, tmpfs};
  const int P = 2;
  const std::string args = "--set train.max_steps=12 --set train.checkpoint_every=4 --set train.keep_checkpoints=1";
  TempDir ref("disk_ref");
  Outcome full = run_command(trainer_command(P, ref.path, args));
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  Outcome first = run_command(trainer_command(P, out, args + " --stop-after 5"));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(out / "checkpoints/step_4/manifest.json"));

  // Fill the tmpfs up to 1 MB, or limit file sizes: every later checkpoint fails.
  std::string limited = trainer_command(P, out, args + " --resume latest");
  if (tmpfs) {
    struct statvfs st {};
    REQUIRE(statvfs(out.c_str(), &st) == 0);
    const int64_t fill = static_cast<int64_t>(st.f_bavail) * st.f_frsize - (1 << 20);
    REQUIRE(fill > 0);
    std::vector<char> block(1 << 20, 1);
    std::ofstream f(out / "filler", std::ios::binary);
    for (int64_t left = fill; left > 0; left -= static_cast<int64_t>(block.size()))
      f.write(block.data(), std::min<int64_t>(left, static_cast<int64_t>(block.size())));
  } else {
    limited = "bash -c 'ulimit -f 1500 && exec " + limited + "'";
  }
  Outcome second = run_command(limited);
  INFO(second.output);
  CHECK(second.exit_code == 1);
  const std::string reason = tmpfs ? "No space left on device" : "File too large";
  CHECK_THAT(second.output, Contains("warning: checkpoint at step 8 failed") && Contains(reason) &&
                                Contains("training continues"));
  CHECK_THAT(second.output, Contains("error: checkpoint at step 12 failed") &&
                                Contains("the last complete checkpoint is " + (out / "checkpoints/step_4").string()));
  CHECK(fs::exists(out / "checkpoints/step_4/manifest.json"));
  CHECK_FALSE(fs::exists(out / "checkpoints/step_8"));  // the unfinished folder gave its space back
  // Every line of metrics.jsonl is a whole record.
  std::ifstream metrics(out / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line); ++records) CHECK_NOTHROW(nlohmann::json::parse(line));
  CHECK(records >= 2);

  // Space again: --resume latest continues from step 4 and ends where an uninterrupted run does.
  fs::remove(out / "filler");
  Outcome third = run_command(trainer_command(P, out, args + " --resume latest"));
  INFO(third.output);
  REQUIRE(third.exit_code == 0);
  CHECK_THAT(third.output, Contains("resumed from " + (out / "checkpoints/step_4").string()));
  require_identical_states(ref.path / "checkpoints/step_12", out / "checkpoints/step_12", P);
}
