#include "trainer/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <stdexcept>

namespace trainer::app {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw std::runtime_error(path + ": cannot open for writing");
  std::fseek(file_, 0, SEEK_END);
  complete_ = std::ftell(file_);
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0) {
    complete_ += static_cast<long>(line.size());
    return;
  }
  const int err = errno;
  // Drop what stdio still holds, then cut the file back to its last whole record.
  std::fclose(file_);
  file_ = nullptr;
  const bool cut = truncate(path_.c_str(), complete_) == 0;
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) throw std::runtime_error(path_ + ": cannot reopen after a failed write: " + std::strerror(errno));
  if (!warned_ || !cut)
    std::fprintf(stderr, "warning: %s: write failed (%s); record of step %s lost%s\n", path_.c_str(),
                 std::strerror(err), record.contains("step") ? record["step"].dump().c_str() : "?",
                 cut ? ", earlier records kept" : " and the file could not be cut back to its last whole record");
  warned_ = true;
}

bool Progress::stdout_is_terminal() { return isatty(fileno(stdout)) != 0; }

void Progress::step(const std::string& text, bool print_line) {
  if (!interactive_) {
    if (print_line) std::printf("%s\n", text.c_str()), std::fflush(stdout);
    return;
  }
  std::string padded = text;
  if (padded.size() < last_width_) padded.append(last_width_ - padded.size(), ' ');
  last_width_ = text.size();
  std::printf("\r%s", padded.c_str());
  std::fflush(stdout);
  live_ = true;
}

void Progress::line(const std::string& text) {
  if (live_) {
    std::printf("\r%*s\r", static_cast<int>(last_width_), "");
    live_ = false;
    last_width_ = 0;
  }
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (live_) std::printf("\n");
  live_ = false;
  std::fflush(stdout);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

}  // namespace trainer::app
