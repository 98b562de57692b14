#include "trainer/tools/report.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/network_calibration.h"
#include "comm/network_model.h"

extern char** environ;

namespace trainer::app {

namespace fs = std::filesystem;

namespace {

// Debian's interpreter: its numpy and matplotlib are the ones scripts/install_deps.sh installs (a
// python3 earlier on PATH, e.g. a virtual environment, may lack them).
constexpr const char* kPython = "/usr/bin/python3";

void check_run_folder(const std::string& folder) {
  if (!fs::is_directory(folder)) throw std::runtime_error(folder + ": no such run folder");
  for (const char* file : {"config.toml", "metrics.jsonl", "comm/rank0.jsonl"}) {
    const fs::path path = fs::path(folder) / file;
    if (!fs::is_regular_file(path))
      throw std::runtime_error(path.string() + ": missing (not a trainer run folder, or comm.log was off)");
  }
}

// This executable, for the script's calls of `trainer whatif`.
fs::path self_path(const std::string& argv0) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(argv0, ec);
  return exe;
}

}  // namespace

std::string report_script(const std::string& argv0) {
  const fs::path exe = self_path(argv0);
  // The build's copy beside the binary (CMakeLists.txt), then a checkout's scripts/ above a build
  // folder inside it, then the source tree this binary was built from.
  const std::vector<fs::path> places{exe.parent_path() / "scripts" / "report.py",
                                     exe.parent_path().parent_path() / "scripts" / "report.py",
                                     fs::path(TRAINER_SOURCE_DIR) / "scripts" / "report.py"};
  std::string looked;
  for (const fs::path& place : places) {
    if (fs::is_regular_file(place)) return place.string();
    looked += (looked.empty() ? "" : ", ") + place.string();
  }
  throw std::runtime_error("scripts/report.py not found (looked in " + looked + ")");
}

int run_report(const ReportOptions& options, const std::string& argv0) {
  if (options.runs.empty()) throw std::runtime_error("trainer report: give at least one run folder");
  comm::parse_latency(options.latency);  // a bad --latency is one clear error here, not in the script
  if (!options.calibration.empty()) comm::load_calibration(options.calibration);  // likewise a bad file
  for (const std::string& folder : options.runs) check_run_folder(folder);
  if (access(kPython, X_OK) != 0)
    throw std::runtime_error(std::string(kPython) + " not found (scripts/install_deps.sh installs it)");
  std::vector<std::string> args{kPython, report_script(argv0)};
  args.insert(args.end(), options.runs.begin(), options.runs.end());
  if (!options.out.empty()) args.insert(args.end(), {"--out", options.out});
  if (options.seed_check) args.emplace_back("--seed-check");
  args.insert(args.end(), {"--trainer", self_path(argv0).string(), "--latency", options.latency});
  if (!options.calibration.empty()) args.insert(args.end(), {"--calibration", options.calibration});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, kPython, nullptr, nullptr, argv.data(), environ);
  if (err != 0) throw std::runtime_error(std::string("cannot start ") + kPython);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waiting for the report script failed");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace trainer::app
