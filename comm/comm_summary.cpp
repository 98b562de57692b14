#include "comm/comm_summary.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace trainer::comm {

namespace {

// One op merged over ranks. Sizes are kept as value -> count: dense calls repeat one size, so the
// gathered data stays small even for long runs.
struct Merged {
  std::string op;
  OpKind kind = OpKind::kOther;
  int64_t calls = 0, bytes = 0, bytes_recv = 0, time_us = 0, wait_us = 0;
  std::map<int64_t, int64_t> sizes;
};

// What the wait split needs besides the ops: each rank's total wait and the clock precision.
struct Waits {
  bool resolved = true;      // every enabled rank had its waits computed
  std::string note;          // why not, when not
  std::vector<int64_t> per_rank;  // total wait per rank (us)
  double precision_us = 0;
};

// This rank's statistics as JSON (sizes run-length encoded after sorting).
std::string serialize(const CommLog& log) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpStats& s : log.op_stats()) {
    std::vector<int64_t> sorted = s.sizes;
    std::sort(sorted.begin(), sorted.end());
    nlohmann::json runs = nlohmann::json::array();
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
      runs.push_back({sorted[i], static_cast<int64_t>(j - i)});
      i = j;
    }
    ops.push_back({{"op", s.op}, {"kind", static_cast<int>(s.kind)}, {"calls", s.calls}, {"bytes", s.bytes},
                   {"bytes_recv", s.bytes_recv}, {"time_us", s.time_us}, {"wait_us", s.wait_us}, {"sizes", runs}});
  }
  nlohmann::json phases = nlohmann::json::array();
  for (Phase ph : {Phase::kDense, Phase::kCompressed}) {
    const PhaseStats& p = log.phase_stats(ph);
    phases.push_back({p.calls, p.bytes, p.bytes_recv, p.time_us, p.wait_us});
  }
  int64_t wait = 0;
  for (int64_t w : log.waits()) wait += w;
  const bool resolved = log.waits().size() == log.collectives().size() && log.wait_note().empty() &&
                        (log.collectives().empty() || !log.waits().empty());
  return nlohmann::json{{"enabled", log.enabled()}, {"ops", ops},
                        {"phases", phases}, {"waits_resolved", resolved},
                        {"wait_note", log.wait_note()}, {"wait_us", wait},
                        {"clock_precision_us", log.clock().precision_us}}
      .dump();
}

// Returns whether that rank's log was enabled.
bool merge(const std::string& blob, std::vector<Merged>& ops, PhaseStats phases[2], Waits& waits) {
  const nlohmann::json j = nlohmann::json::parse(blob);
  if (j.at("enabled").get<bool>()) {
    if (!j.at("waits_resolved").get<bool>()) {
      waits.resolved = false;
      if (waits.note.empty()) waits.note = j.at("wait_note").get<std::string>();
    }
    waits.precision_us = std::max(waits.precision_us, j.at("clock_precision_us").get<double>());
  }
  waits.per_rank.push_back(j.at("wait_us").get<int64_t>());
  for (const auto& o : j.at("ops")) {
    const std::string name = o.at("op").get<std::string>();
    auto it = std::find_if(ops.begin(), ops.end(), [&](const Merged& m) { return m.op == name; });
    if (it == ops.end()) {
      ops.push_back(Merged{});
      it = ops.end() - 1;
      it->op = name;
      it->kind = static_cast<OpKind>(o.at("kind").get<int>());
    }
    it->calls += o.at("calls").get<int64_t>();
    it->bytes += o.at("bytes").get<int64_t>();
    it->bytes_recv += o.at("bytes_recv").get<int64_t>();
    it->time_us += o.at("time_us").get<int64_t>();
    it->wait_us += o.at("wait_us").get<int64_t>();
    for (const auto& run : o.at("sizes")) it->sizes[run.at(0).get<int64_t>()] += run.at(1).get<int64_t>();
  }
  for (int ph = 0; ph < 2; ++ph) {
    const auto& p = j.at("phases").at(ph);
    phases[ph].calls += p.at(0).get<int64_t>();
    phases[ph].bytes += p.at(1).get<int64_t>();
    phases[ph].bytes_recv += p.at(2).get<int64_t>();
    phases[ph].time_us += p.at(3).get<int64_t>();
    phases[ph].wait_us += p.at(4).get<int64_t>();
  }
  return j.at("enabled").get<bool>();
}

// The lower median: an actual message size, never a mean of two.
int64_t median(const std::map<int64_t, int64_t>& sizes, int64_t n) {
  int64_t seen = 0;
  for (const auto& [value, count] : sizes) {
    seen += count;
    if (seen > (n - 1) / 2) return value;
  }
  return 0;
}

std::string human_bytes(int64_t b) {
  char s[32];
  if (b < 1000) {
    std::snprintf(s, sizeof s, "%lld B", static_cast<long long>(b));
  } else if (b < 1000 * 1000) {
    std::snprintf(s, sizeof s, "%.1f kB", b / 1e3);
  } else if (b < 1000LL * 1000 * 1000) {
    std::snprintf(s, sizeof s, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  }
  return s;
}

// GB/s with three decimals; "-" when there is nothing to divide (no bytes, or calls too fast for
// the microsecond clock).
std::string gbps(double bytes, double time_us, double factor) {
  if (time_us <= 0 || bytes <= 0 || factor <= 0) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.3f", bytes / time_us / 1e3 * factor);
  return s;
}

// Milliseconds with three decimals, or "-" when the wait split is not known.
std::string ms_or_dash(bool known, int64_t us) {
  if (!known) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.3f", us / 1e3);
  return s;
}

std::string table(const std::vector<Merged>& ops, const PhaseStats phases[2], int world_size, int enabled_ranks,
                  const Waits& waits) {
  size_t w = 16;
  for (const Merged& m : ops) w = std::max(w, m.op.size());
  const int wi = static_cast<int>(w);
  int64_t all_time = phases[0].time_us + phases[1].time_us;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "communication summary: %d rank%s; calls, bytes and time summed over all ranks\n",
                world_size, world_size == 1 ? "" : "s");
  out += line;
  if (enabled_ranks < world_size) {
    std::snprintf(line, sizeof line, "(the comm log was disabled on %d of %d ranks: their calls are not counted)\n",
                  world_size - enabled_ranks, world_size);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-*s %-10s %9s %12s %12s %10s %10s %10s %12s %12s %12s %10s %7s %10s %10s\n", wi,
                "op", "kind", "calls", "sent MB", "recv MB", "size min", "size med", "size max", "time ms", "wait ms",
                "transfer ms", "mean ms", "time %", "algbw GB/s", "busbw GB/s");
  out += line;
  for (const Merged& m : ops) {
    double total_size = 0;
    for (const auto& [value, count] : m.sizes) total_size += static_cast<double>(value) * count;
    const double time_us = static_cast<double>(m.time_us);
    const std::string alg = gbps(total_size, time_us, 1.0);
    const std::string bus = gbps(total_size, time_us, busbw_factor(m.kind, world_size));
    // Point to point has no last rank to wait for: its time is all transfer (and waiting for the
    // peer to post, which the log cannot tell apart).
    const bool split = waits.resolved && m.kind != OpKind::kPointToPoint && m.kind != OpKind::kOther;
    std::snprintf(line, sizeof line,
                  "%-*s %-10s %9lld %12.3f %12.3f %10s %10s %10s %12.3f %12s %12s %10.3f %7.1f %10s %10s\n", wi,
                  m.op.c_str(), op_kind_name(m.kind), static_cast<long long>(m.calls), m.bytes / 1e6,
                  m.bytes_recv / 1e6, human_bytes(m.sizes.empty() ? 0 : m.sizes.begin()->first).c_str(),
                  human_bytes(median(m.sizes, m.calls)).c_str(),
                  human_bytes(m.sizes.empty() ? 0 : m.sizes.rbegin()->first).c_str(), m.time_us / 1e3,
                  ms_or_dash(split, m.wait_us).c_str(), ms_or_dash(split, m.time_us - m.wait_us).c_str(),
                  m.calls ? m.time_us / 1e3 / m.calls : 0.0, all_time ? 100.0 * m.time_us / all_time : 0.0,
                  alg.c_str(), bus.c_str());
    out += line;
  }
  out += "\n";
  std::snprintf(line, sizeof line, "%-*s %-10s %9s %12s %12s %12s %12s %10s %7s\n", wi, "phase", "", "calls",
                "sent MB", "recv MB", "time ms", "wait ms", "mean ms", "time %");
  out += line;
  PhaseStats total;
  auto row = [&](const char* name, const PhaseStats& p) {
    std::snprintf(line, sizeof line, "%-*s %-10s %9lld %12.3f %12.3f %12.3f %12s %10.3f %7.1f\n", wi, name, "",
                  static_cast<long long>(p.calls), p.bytes / 1e6, p.bytes_recv / 1e6, p.time_us / 1e3,
                  ms_or_dash(waits.resolved, p.wait_us).c_str(), p.calls ? p.time_us / 1e3 / p.calls : 0.0,
                  all_time ? 100.0 * p.time_us / all_time : 0.0);
    out += line;
  };
  for (Phase ph : {Phase::kDense, Phase::kCompressed}) {
    const PhaseStats& p = phases[static_cast<int>(ph)];
    row(phase_name(ph), p);
    total.calls += p.calls;
    total.bytes += p.bytes;
    total.bytes_recv += p.bytes_recv;
    total.time_us += p.time_us;
    total.wait_us += p.wait_us;
  }
  row("total", total);
  out += "\n";
  if (!waits.resolved) {
    out += (waits.note.empty() ? std::string("wait not computed (the ranks did not compare entry times: resolve_waits did not run)") : waits.note) +
           "\n";
    return out;
  }
  // The straggler view: a rank that waits little is the one the others wait for.
  out += "wait per rank in collectives, ms:";
  for (size_t r = 0; r < waits.per_rank.size(); ++r) {
    std::snprintf(line, sizeof line, " r%zu %.3f", r, waits.per_rank[r] / 1e3);
    out += line;
  }
  std::snprintf(line, sizeof line, "\n(wait: time in a collective before the last rank entered it; clocks aligned "
                "to +-%.0f us)\n", waits.precision_us);
  out += line;
  return out;
}

std::string machine_readable(const std::vector<Merged>& ops, const PhaseStats phases[2], int world_size,
                             int enabled_ranks) {
  nlohmann::json out_ops = nlohmann::json::array();
  for (const Merged& m : ops) {
    nlohmann::json sizes = nlohmann::json::array();
    for (const auto& [value, count] : m.sizes) sizes.push_back({value, count});
    out_ops.push_back({{"op", m.op}, {"kind", op_kind_name(m.kind)}, {"calls", m.calls}, {"bytes", m.bytes},
                       {"bytes_recv", m.bytes_recv}, {"time_us", m.time_us}, {"sizes", sizes}});
  }
  nlohmann::json out_phases;
  for (Phase ph : {Phase::kDense, Phase::kCompressed}) {
    const PhaseStats& p = phases[static_cast<int>(ph)];
    out_phases[phase_name(ph)] = {
        {"calls", p.calls}, {"bytes", p.bytes}, {"bytes_recv", p.bytes_recv}, {"time_us", p.time_us}};
  }
  return nlohmann::json{{"world_size", world_size}, {"enabled_ranks", enabled_ranks}, {"ops", out_ops},
                        {"phases", out_phases}}
             .dump(1) +
         "\n";
}

// async_ps: the messages each rank pushed (PUSH_GRAD sent) and pulled (PULL_PARAMS received), one
// per server per step on a worker, one per worker per step on a server; "" for other methods.
std::string per_rank_pushes(const std::vector<std::string>& blobs) {
  std::string out;
  for (size_t r = 0; r < blobs.size(); ++r) {
    if (blobs[r].empty()) continue;
    int64_t pushes = 0, pulls = 0;
    const nlohmann::json stats = nlohmann::json::parse(blobs[r]);
    for (const auto& op : stats.at("ops")) {
      if (op["op"] == "PUSH_GRAD") pushes = op["calls"].get<int64_t>();
      if (op["op"] == "PULL_PARAMS") pulls = op["calls"].get<int64_t>();
    }
    if (pushes == 0 && pulls == 0) continue;
    out += " r" + std::to_string(r) + " " + std::to_string(pushes) + "/" + std::to_string(pulls);
  }
  return out.empty() ? out : "parameter server messages per rank, PUSH_GRAD/PULL_PARAMS:" + out + "\n";
}

}  // namespace

double busbw_factor(OpKind kind, int world_size) {
  const double p = world_size;
  switch (kind) {
    case OpKind::kAllreduce: return 2.0 * (p - 1) / p;
    case OpKind::kAllgather:
    case OpKind::kAllgatherv:
    case OpKind::kAlltoall: return (p - 1) / p;
    case OpKind::kBarrier: return 0.0;
    case OpKind::kBroadcast:
    case OpKind::kPointToPoint:
    case OpKind::kOther: return 1.0;
  }
  return 1.0;
}

std::string comm_summary(Communicator& comm, std::string* machine) {
  CommLog::Pause pause(comm.log());
  const std::string mine = serialize(comm.log());
  const int world_size = comm.size();
  int64_t length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(world_size);
  comm.allgather(&length, 1, lengths.data(), DType::kI64, "SUMMARY_LENGTHS");
  // Only rank 0 needs the statistics: one message from each rank, not an allgather of everything.
  if (comm.rank() != 0) {
    Request r = comm.isend(mine.data(), length, DType::kU8, 0, 0, "SUMMARY_STATS");
    comm.wait(r);
    return "";
  }
  std::vector<std::string> blobs(world_size);
  std::vector<Request> requests;
  for (int r = 1; r < world_size; ++r) {
    blobs[r].resize(static_cast<size_t>(lengths[r]));
    requests.push_back(comm.irecv(blobs[r].data(), lengths[r], DType::kU8, r, 0, "SUMMARY_STATS"));
  }
  comm.wait_all(requests);
  blobs[0] = mine;
  std::vector<Merged> ops;
  PhaseStats phases[2];
  int enabled_ranks = 0;
  Waits waits;
  for (const std::string& b : blobs) enabled_ranks += merge(b, ops, phases, waits) ? 1 : 0;
  if (machine) *machine = machine_readable(ops, phases, world_size, enabled_ranks);
  return table(ops, phases, world_size, enabled_ranks, waits) + per_rank_pushes(blobs);
}

void write_comm_summary(const std::string& text, const std::string& path) {
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace trainer::comm
