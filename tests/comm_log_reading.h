// Reading a run's comm log (comm/rank<R>.jsonl, comm/comm_log.h) in the end-to-end tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace trainer::testing {

// Per op, the messages of `rank` that started while their own step's forward and backward still
// ran. A step's FORWARD_BACKWARD record is written when backward has ended, after the records of
// the messages that completed during it, so the log is read twice: the intervals, then the messages.
inline std::map<std::string, int> messages_during_backward(const std::filesystem::path& run, int rank = 0) {
  const auto file = run / "comm" / ("rank" + std::to_string(rank) + ".jsonl");
  std::map<int64_t, int64_t> backward_end;  // by step
  {
    std::ifstream log(file);
    for (std::string line; std::getline(log, line);) {
      const auto rec = nlohmann::json::parse(line);
      if (rec["op"] == "FORWARD_BACKWARD") backward_end[rec["step"].get<int64_t>()] = rec["t_end_us"].get<int64_t>();
    }
  }
  std::map<std::string, int> during;
  std::ifstream log(file);
  for (std::string line; std::getline(log, line);) {
    const auto rec = nlohmann::json::parse(line);
    const auto end = backward_end.find(rec["step"].get<int64_t>());
    if (rec["op"] != "FORWARD_BACKWARD" && end != backward_end.end() && rec["t_start_us"].get<int64_t>() < end->second)
      ++during[rec["op"].get<std::string>()];
  }
  return during;
}

// Milliseconds `rank` spent in forward and backward (its FORWARD_BACKWARD records) and in its
// messages (every other record, start to end: a collective's time includes waiting for the others).
struct RankTimes {
  double compute_ms = 0, messages_ms = 0;
};
inline RankTimes rank_times(const std::filesystem::path& run, int rank) {
  RankTimes t;
  std::ifstream log(run / "comm" / ("rank" + std::to_string(rank) + ".jsonl"));
  for (std::string line; std::getline(log, line);) {
    const auto rec = nlohmann::json::parse(line);
    if (!rec.contains("t_start_us")) continue;
    const double ms = (rec["t_end_us"].get<int64_t>() - rec["t_start_us"].get<int64_t>()) / 1000.0;
    (rec["op"] == "FORWARD_BACKWARD" ? t.compute_ms : t.messages_ms) += ms;
  }
  return t;
}

}  // namespace trainer::testing
