// What a run reports: metrics.jsonl (one JSON object per line, written by rank 0) and the
// human-facing progress output (a live line on a terminal, plain periodic lines otherwise).
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace trainer::app {

class MetricsWriter {
 public:
  // Opens <dir>/metrics.jsonl for appending (a resumed run continues the same file).
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Writes one record and flushes, so a killed run keeps everything it logged. A failed write (full
  // disk, I/O error) must not end training nor leave half a record: the file is cut back to its
  // last complete record, this record is lost, and a warning is printed (once).
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  long complete_ = 0;  // bytes of whole records in the file
  bool warned_ = false;
};

class Progress {
 public:
  // interactive: redraw one line with '\r' (a terminal); otherwise print whole lines.
  explicit Progress(bool interactive) : interactive_(interactive) {}
  static bool stdout_is_terminal();
  // A step update: redrawn on terminals; printed as a line when `print_line` (log cadence) otherwise.
  void step(const std::string& text, bool print_line);
  // A line that must stay (evaluation results, warnings, the summary).
  void line(const std::string& text);
  void finish();

 private:
  bool interactive_;
  bool live_ = false;
  size_t last_width_ = 0;
};

std::string format_duration(double seconds);

}  // namespace trainer::app
