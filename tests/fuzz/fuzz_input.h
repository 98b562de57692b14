// What every fuzz target shares: a scratch folder for the files the readers open, splitting one
// input into several files or strings, and the error-message contract the targets enforce.
//
// The readers take paths (as the trainer gives them), so a target writes its input to files under
// a per-process folder in /dev/shm (memory, so a run costs no disk I/O) and calls the reader on them.
// A reader's documented exception ends the run normally, but only if its message is one line that
// names the file or key: anything else (another exception type, a crash, a sanitizer report, a
// multi-line or anonymous message) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace trainer::fuzz {

// Created on first use, removed at exit; one per process, so parallel fuzzers do not collide.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    // scripts/fuzz passes a folder it removes afterwards: libFuzzer ends some runs with _Exit (a
    // crash, a timeout), which skips the atexit below.
    std::error_code ec;
    const char* given = std::getenv("TRAINER_FUZZ_SCRATCH");
    std::filesystem::path base = given && *given ? std::filesystem::path(given)
                                 : std::filesystem::is_directory("/dev/shm", ec)
                                     ? std::filesystem::path("/dev/shm")
                                     : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("trainer_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// The parts of an input separated by the line "%%" (the seeds show the layout), at most max_parts:
// the last part keeps any further separators. Missing parts are empty.
inline std::vector<std::string> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
  static const std::string sep = "\n%%\n";
  const std::string all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t begin = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = all.find(sep, begin);
    if (at == std::string::npos) break;
    parts.push_back(all.substr(begin, at - begin));
    begin = at + sep.size();
  }
  parts.push_back(all.substr(begin));
  parts.resize(max_parts);
  return parts;
}

// The error contract of every reader: one non-empty line that names `subject` (the file, folder or
// key). A violation aborts, which libFuzzer reports as a crash with the input saved.
inline void check_error_message(const std::string& message, const std::string& subject) {
  const bool one_line = !message.empty() && message.find('\n') == std::string::npos;
  if (!one_line || message.find(subject) == std::string::npos) {
    std::fprintf(stderr, "fuzz harness: error message breaks the contract (one line naming %s):\n%s\n",
                 subject.c_str(), message.c_str());
    std::abort();
  }
}

}  // namespace trainer::fuzz
