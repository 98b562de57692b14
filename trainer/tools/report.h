// `trainer report RUN_DIR [RUN_DIR2 ...]`: checks that the folders are runs, then runs
// scripts/report.py (Debian's /usr/bin/python3 with numpy and matplotlib), which writes
// RUN_DIR/report/report.md and its PNG figures from the logs (docs/architecture.md section 3). The
// script calls this binary's `trainer whatif --json` for the scalability view (E(P) against bandwidth),
// so the model has one implementation.
#pragma once

#include <string>
#include <vector>

namespace trainer::app {

struct ReportOptions {
  std::vector<std::string> runs;  // the first is reported in full, the others compared with it
  std::string out;                // report folder; empty: <first run>/report
  bool seed_check = false;        // add the check of the published AN4 Ok-Top-k counts
  std::string latency = "50us";   // per-message latency of the scalability view (`trainer whatif`)
  std::string calibration;        // a `trainer calibrate` file: the view adds the step at its rates
};

// The report script: scripts/report.py beside the executable's build folder (build/trainer ->
// scripts/report.py), else in the source tree this binary was built from (TRAINER_SOURCE_DIR).
// Throws std::runtime_error naming both places when neither has it.
std::string report_script(const std::string& argv0);

// Throws std::runtime_error naming the first missing file (config.toml, metrics.jsonl,
// comm/rank0.jsonl) of the first folder that is not a run. Returns the script's exit status.
int run_report(const ReportOptions& options, const std::string& argv0);

}  // namespace trainer::app
