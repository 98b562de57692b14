#include "trainer/tools/whatif.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "comm/sync/registry.h"
#include "trainer/config/config.h"

namespace trainer::app {
namespace fs = std::filesystem;

namespace {

// Calls that are not part of a training step.
bool outside_step(const std::string& op) {
  return op == "ALLREDUCE_EVAL" || op == "ALLREDUCE_CHECK" || op == "BARRIER_SETUP" || op.rfind("CHECKPOINT_", 0) == 0;
}

// A call's data size S from its record (comm_summary.h's definition).
double data_size(comm::OpKind kind, double bytes, double bytes_recv, int ranks) {
  switch (kind) {
    case comm::OpKind::kAllgather:
    case comm::OpKind::kAllgatherv: return bytes + bytes_recv;
    case comm::OpKind::kAlltoall: return ranks > 1 ? bytes * ranks / (ranks - 1) : bytes;
    default: return std::max(bytes, bytes_recv);
  }
}

struct StepCalls {
  std::vector<std::pair<int64_t, int64_t>> intervals;
  int64_t wait_us = 0;
};

struct OpTotals {
  comm::OpKind kind = comm::OpKind::kOther;
  bool overlapped = false;
  double calls = 0, size = 0, sent = 0, received = 0, sends = 0, receives = 0, time_us = 0, wait_us = 0;
};

// Rank 0's comm log, by phase: per step its calls, per op the totals, the overlapped timeline.
struct RankLog {
  std::map<std::string, std::map<int64_t, StepCalls>> steps;
  std::map<std::string, std::map<std::string, OpTotals>> ops;
  std::map<std::string, std::vector<std::string>> op_order;  // ops in first-call order
  std::map<std::string, OverlapLog> timelines;
  int64_t collectives = 0, with_wait = 0;
};

// One record of the log into `log` (`ranks`: the run's, for data sizes).
void add_record(const nlohmann::json& r, int ranks, RankLog& log) {
  const std::string op = r.at("op").get<std::string>();
  if (outside_step(op)) return;
  const std::string phase = r.at("phase").get<std::string>();
  const int64_t step = r.at("step").get<int64_t>();
  const int64_t t0 = r.at("t_start_us").get<int64_t>(), t1 = r.at("t_end_us").get<int64_t>();
  if (r.value("kind", "") == "compute") {  // FORWARD_BACKWARD: not a message
    log.timelines[phase].add_compute(step, t0, t1);
    return;
  }
  const int64_t ready_us = r.value("ready_us", int64_t{-1});
  const double bytes = r.at("bytes").get<double>(), recv = r.at("bytes_recv").get<double>();
  const comm::OpKind kind = comm::kind_from_tag(op);
  StepCalls& s = log.steps[phase][step];
  s.intervals.emplace_back(t0, t1);
  auto [it, fresh] = log.ops[phase].try_emplace(op);
  if (fresh) log.op_order[phase].push_back(op);
  OpTotals& o = it->second;
  o.kind = kind;
  o.overlapped = o.overlapped || ready_us >= 0;
  o.calls += 1;
  log.timelines[phase].add_call(step, t0, t1, ready_us, data_size(kind, bytes, recv, ranks),
                                r.value("wait_us", int64_t{0}));
  o.time_us += static_cast<double>(t1 - t0);
  if (kind == comm::OpKind::kPointToPoint || kind == comm::OpKind::kOther) {
    o.size += std::max(bytes, recv);
    o.sent += bytes;
    o.received += recv;
    o.sends += bytes > 0 ? 1 : 0;
    o.receives += bytes > 0 ? 0 : 1;
    return;
  }
  o.size += data_size(kind, bytes, recv, ranks);
  ++log.collectives;
  if (r.contains("wait_us")) {
    ++log.with_wait;
    o.wait_us += r["wait_us"].get<double>();
    s.wait_us += r["wait_us"].get<int64_t>();
  }
}

RankLog read_rank_log(const std::string& log_path, int ranks) {
  std::ifstream in(log_path);
  RankLog log;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    try {
      add_record(nlohmann::json::parse(line), ranks, log);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(log_path + ":" + std::to_string(line_no) + ": not a comm log record (" + e.what() + ")");
    }
  }
  if (log.steps.empty()) throw std::runtime_error(log_path + ": no training-step records");
  return log;
}

}  // namespace

RunMeasurement measure_run(const std::string& run_dir) {
  RunMeasurement run;
  run.run_dir = run_dir;
  const Config config = load_config(run_dir + "/config.toml");
  run.method = config.sync.method;
  for (int r = 0;; ++r) {
    if (!fs::exists(run_dir + "/comm/rank" + std::to_string(r) + ".jsonl")) break;
    run.ranks = r + 1;
  }
  if (run.ranks == 0) throw std::runtime_error(run_dir + "/comm/rank0.jsonl: missing (run with comm.log = true)");

  RankLog log = read_rank_log(run_dir + "/comm/rank0.jsonl", run.ranks);
  auto& steps = log.steps;
  run.waits_known = log.collectives > 0 && log.with_wait == log.collectives;

  // metrics.jsonl: step times by phase (the phase of an interval's last step).
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::ifstream metrics(metrics_path);
  if (!metrics) throw std::runtime_error(metrics_path + ": missing");
  std::map<std::string, std::vector<double>> step_ms;
  std::vector<double> outside_sync_ms;  // t_data + t_compute + t_optim, all records
  std::string line;
  int64_t line_no = 0;
  while (std::getline(metrics, line)) {
    ++line_no;
    try {
      const nlohmann::json m = nlohmann::json::parse(line);
      if (!m.contains("t_compute_ms")) continue;  // evaluation records
      step_ms[m.at("phase").get<std::string>()].push_back(m.at("t_data_ms").get<double>() +
                                                          m.at("t_compute_ms").get<double>() +
                                                          m.at("t_sync_ms").get<double>() +
                                                          m.at("t_optim_ms").get<double>());
      outside_sync_ms.push_back(m.at("t_data_ms").get<double>() + m.at("t_compute_ms").get<double>() +
                                m.at("t_optim_ms").get<double>());
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(metrics_path + ":" + std::to_string(line_no) + ": " + e.what());
    }
  }

  for (const char* name : {"dense", "compressed"}) {
    if (!steps.count(name)) continue;
    if (outside_sync_ms.empty()) throw std::runtime_error(metrics_path + ": no step record");
    PhaseMeasurement p;
    p.phase = name;
    p.logged_steps = static_cast<int64_t>(steps[name].size());
    p.metric_records = static_cast<int64_t>(step_ms[name].size());
    p.step_ms = median(step_ms[name]);  // 0 when no record ended in this phase (see below)
    // Medians over steps, like the step time: the first steps (primitive creation, one rank's
    // late start) would otherwise dominate a short run's mean.
    std::vector<double> union_ms, wait_ms;
    for (auto& [step, s] : steps[name]) {
      std::sort(s.intervals.begin(), s.intervals.end());
      int64_t end = INT64_MIN, covered = 0;
      for (const auto& [a, b] : s.intervals) {
        const int64_t from = std::max(a, end);
        if (b > from) covered += b - from;
        end = std::max(end, b);
      }
      union_ms.push_back(static_cast<double>(covered) / 1e3);
      wait_ms.push_back(static_cast<double>(s.wait_us) / 1e3);
    }
    const double n = static_cast<double>(p.logged_steps);
    p.comm_ms = median(union_ms);
    p.wait_ms = median(wait_ms);
    // A short phase (a dense warmup inside one metrics interval) has no record of its own: its
    // compute is the other steps' data + forward/backward + optimizer, without the sync's local work.
    p.compute_ms = p.metric_records > 0 ? std::max(0.0, p.step_ms - p.comm_ms) : median(outside_sync_ms);
    p.overlap = log.timelines[name].measure();
    if (!p.overlap.buckets.empty()) {
      // Communication during backward cost no step time: only what was exposed after it.
      if (p.metric_records > 0) p.compute_ms = std::max(0.0, p.step_ms - p.overlap.exposed_ms);
      p.wait_ms = p.overlap.wait_after_ms;
    }
    for (const std::string& op : log.op_order[name]) {
      const OpTotals& o = log.ops[name][op];
      OpMeasurement m;
      m.op = op;
      m.kind = o.kind;
      m.calls_per_step = o.calls / n;
      m.size_per_call = o.calls > 0 ? o.size / o.calls : 0;
      m.sent_per_step = o.sent / n;
      m.received_per_step = o.received / n;
      m.sends_per_step = o.sends / n;
      m.receives_per_step = o.receives / n;
      m.measured_ms_per_step = o.time_us / n / 1e3;
      m.wait_ms_per_step = o.wait_us / n / 1e3;
      m.overlapped = o.overlapped && !p.overlap.buckets.empty();
      p.ops.push_back(m);
    }
    run.phases.push_back(p);
  }
  return run;
}

double CostedStep::serial_seconds() const {
  double seconds = p2p_seconds;
  for (const CostedOp& o : ops) seconds += o.calls_per_step * o.seconds_per_call;
  return seconds;
}

double CostedStep::serial_seconds_after_backward() const {
  double seconds = p2p_seconds;
  for (const CostedOp& o : ops)
    if (!o.overlapped) seconds += o.calls_per_step * o.seconds_per_call;
  return seconds;
}

CostedStep cost_step(const RunMeasurement& run, const PhaseMeasurement& phase, const comm::NetworkRates& rates,
                     int ranks) {
  const double p0 = run.ranks, p1 = ranks;
  const double ratio = p1 / p0;
  // The method's spec says whether its allgatherv grows with the ranks (whatif.h); a method this
  // build does not know (an old log) is taken as one whose lists do.
  const comm::SyncMethod* method = comm::find_sync_method(run.method);
  const bool fixed_gather = method && method->can.fixed_gather_total;
  // Messages per step and their bytes with P' ranks (oktopk's split-and-reduce: see whatif.h).
  const double count_scale = run.ranks > 1 ? (p1 - 1) / (p0 - 1) : 0;
  const double bytes_scale = run.ranks > 1 ? ((p1 - 1) / p1) / ((p0 - 1) / p0) : 0;
  CostedStep step;
  double sends = 0, receives = 0, sent = 0, received = 0;
  for (const OpMeasurement& o : phase.ops) {
    CostedOp c{o.op, o.kind, o.calls_per_step, o.size_per_call, 0, o.overlapped};
    switch (o.kind) {
      case comm::OpKind::kPointToPoint:
      case comm::OpKind::kOther:
        sends += o.sends_per_step * count_scale;
        receives += o.receives_per_step * count_scale;
        sent += o.sent_per_step * bytes_scale;
        received += o.received_per_step * bytes_scale;
        break;
      default:
        if (o.kind == comm::OpKind::kAllgather || o.kind == comm::OpKind::kAlltoall ||
            (o.kind == comm::OpKind::kAllgatherv && !fixed_gather))
          c.size_per_call *= ratio;
        c.seconds_per_call = o.kind == comm::OpKind::kAllreduce
                                 ? rates.allreduce_seconds(c.size_per_call, ranks)
                                 : comm::collective_seconds(o.kind, c.size_per_call, ranks, rates.for_kind(o.kind));
    }
    step.ops.push_back(c);
  }
  // comm::p2p_seconds with fractional means of messages per step (counts averaged over steps).
  const comm::Network& link = rates.for_kind(comm::OpKind::kPointToPoint);
  if (sends + receives > 0)
    step.p2p_seconds = std::max(sends, receives) * link.latency + std::max(sent, received) / link.bandwidth;
  return step;
}

std::vector<PhasePrediction> predict(const RunMeasurement& run, const comm::NetworkRates& rates, int ranks) {
  std::vector<PhasePrediction> out;
  for (const PhaseMeasurement& ph : run.phases) {
    PhasePrediction pr;
    pr.phase = ph.phase;
    pr.compute_ms = ph.compute_ms;
    pr.measured_step_ms = ph.step_ms;
    pr.wait_ms = ranks > 1 ? ph.wait_ms : 0;
    const CostedStep costed = cost_step(run, ph, rates, ranks);
    pr.comm_ms = ph.overlap.buckets.empty()
                     ? costed.serial_seconds() * 1e3
                     : (costed.serial_seconds_after_backward() + exposed_bucket_seconds(ph.overlap, rates, ranks)) * 1e3;
    pr.step_ms = pr.compute_ms + pr.comm_ms + pr.wait_ms;
    pr.comm_share = pr.step_ms > 0 ? (pr.comm_ms + pr.wait_ms) / pr.step_ms : 0;
    pr.efficiency = pr.step_ms > 0 ? pr.compute_ms / pr.step_ms : 1;
    out.push_back(pr);
  }
  return out;
}

std::vector<PhasePrediction> predict(const RunMeasurement& run, const comm::Network& net, int ranks) {
  return predict(run, comm::NetworkRates::uniform(net), ranks);
}

std::string whatif_report(const RunMeasurement& run, const std::vector<PhasePrediction>& predictions,
                          const WhatifNetwork& network, int ranks) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "whatif %s: measured with %d ranks (sync %s); predicted for %d ranks\n",
                run.run_dir.c_str(), run.ranks, run.method.c_str(), ranks);
  out += line;
  out += "rates: " + network.description + "\n";
  if (!network.extrapolation.empty()) out += network.extrapolation + "\n";
  if (!run.waits_known) out += "(the log has no wait_us: the run did not end normally; wait counted as 0)\n";
  std::snprintf(line, sizeof line, "%-11s %10s %10s %10s %10s %12s %8s %8s %14s\n", "phase", "compute ms", "comm ms",
                "wait ms", "step ms", "samples/s x", "comm %", "E(P)", "measured step");
  out += line;
  for (size_t i = 0; i < predictions.size(); ++i) {
    const PhasePrediction& p = predictions[i];
    // Throughput relative to one rank: P * E(P).
    char measured[32] = "-";
    if (run.phases[i].metric_records > 0) std::snprintf(measured, sizeof measured, "%.3f ms", p.measured_step_ms);
    std::snprintf(line, sizeof line, "%-11s %10.3f %10.3f %10.3f %10.3f %12.2f %7.1f%% %8.3f %14s\n",
                  p.phase.c_str(), p.compute_ms, p.comm_ms, p.wait_ms, p.step_ms, ranks * p.efficiency,
                  100 * p.comm_share, p.efficiency, measured);
    out += line;
  }
  out += "\nmeasured per step (rank 0):\n";
  for (const PhaseMeasurement& ph : run.phases) {
    if (ph.metric_records > 0 && !ph.overlap.buckets.empty()) {
      std::snprintf(line, sizeof line, "%s: %lld logged steps, %lld metrics records; step %.3f ms = compute %.3f + "
                    "exposed comm %.3f (of which wait %.3f); on the wire %.3f\n",
                    ph.phase.c_str(), static_cast<long long>(ph.logged_steps),
                    static_cast<long long>(ph.metric_records), ph.step_ms, ph.compute_ms, ph.overlap.exposed_ms,
                    ph.wait_ms, ph.comm_ms);
    } else if (ph.metric_records > 0) {
      std::snprintf(line, sizeof line, "%s: %lld logged steps, %lld metrics records; step %.3f ms = compute %.3f + "
                    "comm %.3f (of which wait %.3f)\n",
                    ph.phase.c_str(), static_cast<long long>(ph.logged_steps),
                    static_cast<long long>(ph.metric_records), ph.step_ms, ph.compute_ms, ph.comm_ms, ph.wait_ms);
    } else {
      std::snprintf(line, sizeof line, "%s: %lld logged steps, no metrics record of its own (compute: the other "
                    "steps' data + forward/backward + optimizer %.3f ms); comm %.3f (of which wait %.3f)\n",
                    ph.phase.c_str(), static_cast<long long>(ph.logged_steps), ph.compute_ms, ph.comm_ms, ph.wait_ms);
    }
    out += line;
    if (!ph.overlap.buckets.empty()) {
      std::snprintf(line, sizeof line, "  overlapped: %zu dense buckets sent during forward/backward (%.3f ms); %.3f ms "
                    "of communication after it (the step's compute is the step minus that)\n",
                    ph.overlap.buckets.size(), ph.overlap.backward_ms, ph.overlap.exposed_ms);
      out += line;
    }
    for (const OpMeasurement& o : ph.ops) {
      std::snprintf(line, sizeof line, "  %-22s %-10s %8.2f calls %12.0f B/call %10.3f ms %10.3f ms wait\n",
                    o.op.c_str(), comm::op_kind_name(o.kind), o.calls_per_step, o.size_per_call,
                    o.measured_ms_per_step, o.wait_ms_per_step);
      out += line;
    }
  }
  out += "(model: comm/network_model.h; sizes with other rank counts: trainer/tools/whatif.h; rates: " +
         std::string(network.calibrated ? "calibrated, allreduce at its fit and every other kind at the point-to-point "
                                          "fit" : "nominal, every kind on the one link") + ")\n";
  return out;
}

}  // namespace trainer::app

namespace trainer::app {

std::string whatif_json(const RunMeasurement& run, const std::vector<PhasePrediction>& predictions,
                        const WhatifNetwork& network, int ranks) {
  nlohmann::json phases = nlohmann::json::array();
  for (size_t i = 0; i < predictions.size(); ++i) {
    const PhasePrediction& p = predictions[i];
    nlohmann::json o{{"phase", p.phase},         {"compute_ms", p.compute_ms}, {"comm_ms", p.comm_ms},
                     {"wait_ms", p.wait_ms},     {"step_ms", p.step_ms},       {"comm_share", p.comm_share},
                     {"efficiency", p.efficiency}};
    if (run.phases[i].metric_records > 0) o["measured_step_ms"] = p.measured_step_ms;
    phases.push_back(o);
  }
  auto rates = [](const comm::Network& n) {
    return nlohmann::json{{"bandwidth_bytes_per_s", n.bandwidth}, {"latency_s", n.latency}};
  };
  nlohmann::json net{{"source", network.calibrated ? "calibrated" : "nominal"},
                     {"description", network.description},
                     {"extrapolation", network.extrapolation},
                     {"allreduce", rates(network.rates.allreduce)},
                     {"messages", rates(network.rates.messages)}};
  if (network.calibrated) {
    net["calibration"] = network.calibration_path;
    net["calibration_ranks"] = network.calibration_ranks;
    net["calibration_date"] = network.calibration_date;
  }
  return nlohmann::json{{"run_dir", run.run_dir},
                        {"method", run.method},
                        {"measured_ranks", run.ranks},
                        {"ranks", ranks},
                        {"bandwidth_bytes_per_s", network.rates.allreduce.bandwidth},
                        {"latency_s", network.rates.allreduce.latency},
                        {"network", net},
                        {"waits_known", run.waits_known},
                        {"phases", phases}}
             .dump() +
         "\n";
}

}  // namespace trainer::app
