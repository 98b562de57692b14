// Shared test helpers: running a command (exit code and output) and scratch folders.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

namespace trainer::testing {

struct Outcome {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell, killed after 600 s so a hang fails the test instead of CI.
inline Outcome run_command(const std::string& command) {
  std::FILE* pipe = popen(("timeout 600 " + command + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  Outcome o;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) o.output += buf;
  const int status = pclose(pipe);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

// A fresh folder under the system temp dir, unique to this process (and to this object when no
// name is given), removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name = "") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("trainer_test_" + std::to_string(getpid()) + "_" + (name.empty() ? std::to_string(counter++) : name));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace trainer::testing
