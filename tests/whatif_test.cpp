// The alpha-beta network model (comm/network_model.h) and `trainer whatif` (trainer/tools/whatif.h)
// against cases computed by hand: each collective's schedule, the unit parsers, and whole runs
// written as files (config.toml, metrics.jsonl, comm logs) with known compute, comm and wait.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "comm/network_model.h"
#include "process.h"
#include "trainer/config/config.h"
#include "trainer/tools/whatif.h"

using namespace trainer::comm;
using trainer::app::measure_run;
using trainer::app::predict;
using trainer::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const Network kNet{1e9, 10e-6};  // 8 Gbit/s = 1 GB/s, 10 us per message

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string record(int64_t step, const char* phase, const char* op, int64_t bytes, int64_t bytes_recv, int peer,
                   int64_t t0, int64_t t1, int64_t wait = -1) {
  std::string s = "{\"step\":" + std::to_string(step) + ",\"phase\":\"" + phase + "\",\"op\":\"" + op +
                  "\",\"bytes\":" + std::to_string(bytes) + ",\"bytes_recv\":" + std::to_string(bytes_recv) +
                  ",\"peer\":" + std::to_string(peer) + ",\"t_start_us\":" + std::to_string(t0) +
                  ",\"t_end_us\":" + std::to_string(t1);
  if (wait >= 0) s += ",\"wait_us\":" + std::to_string(wait) + ",\"transfer_us\":" + std::to_string(t1 - t0 - wait);
  return s + "}\n";
}

std::string metrics_record(int64_t step, const char* phase) {
  // Step time 1 + 10 + 5 + 1 = 17 ms.
  return "{\"step\":" + std::to_string(step) + ",\"phase\":\"" + phase +
         "\",\"t_data_ms\":1,\"t_compute_ms\":10,\"t_sync_ms\":5,\"t_optim_ms\":1,\"loss\":1}\n";
}

void write_config(const fs::path& dir, const std::string& method) {
  trainer::Config c;
  c.sync.method = method;
  write(dir / "config.toml", trainer::to_toml(c));
}

}  // namespace

TEST_CASE("each collective costs its algorithm's schedule") {
  const double a = kNet.latency, b = kNet.bandwidth;
  // Ring allreduce of 1 MB on 4 ranks: 6 steps of 250 kB each way = 60 us + 1.5 ms; recursive
  // doubling would be 2 x (10 us + 1 ms), so the ring wins.
  CHECK(collective_seconds(OpKind::kAllreduce, 1e6, 4, kNet) == Approx(6 * a + 1.5e6 / b));
  // 16 bytes: recursive doubling, 2 rounds of (10 us + 16 ns), beats the ring's 60 us.
  CHECK(collective_seconds(OpKind::kAllreduce, 16, 4, kNet) == Approx(2 * (a + 16 / b)));
  // 3 ranks: ceil(log2 3) = 2 rounds.
  CHECK(collective_seconds(OpKind::kAllreduce, 16, 3, kNet) == Approx(2 * (a + 16 / b)));
  // Allgather(v) ring of a 800 kB output on 8 ranks: 7 steps of 100 kB.
  CHECK(collective_seconds(OpKind::kAllgatherv, 8e5, 8, kNet) == Approx(7 * a + 7e5 / b));
  CHECK(collective_seconds(OpKind::kAllgather, 8e5, 8, kNet) == Approx(7 * a + 7e5 / b));
  // Pairwise alltoall of a 4 kB send buffer on 4 ranks: 3 exchanges of 1 kB.
  CHECK(collective_seconds(OpKind::kAlltoall, 4000, 4, kNet) == Approx(3 * (a + 1000 / b)));
  CHECK(collective_seconds(OpKind::kBroadcast, 1e6, 8, kNet) == Approx(3 * (a + 1e6 / b)));
  CHECK(collective_seconds(OpKind::kBarrier, 0, 8, kNet) == Approx(3 * a));
  CHECK(collective_seconds(OpKind::kPointToPoint, 5000, 2, kNet) == Approx(a + 5000 / b));
  // One rank: no collective traffic.
  CHECK(collective_seconds(OpKind::kAllreduce, 1e6, 1, kNet) == 0);
  // Messages share the link, each direction at once.
  CHECK(p2p_seconds(3, 2, 6000, 9000, kNet) == Approx(3 * a + 9000 / b));
  CHECK(p2p_seconds(0, 0, 0, 0, kNet) == 0);
}

TEST_CASE("bandwidth and latency units, and bad ones named") {
  CHECK(parse_bandwidth("100mbit") == Approx(12.5e6));
  CHECK(parse_bandwidth("1gbit") == Approx(125e6));
  CHECK(parse_bandwidth("10Gbit") == Approx(1.25e9));
  CHECK(parse_bandwidth("1.25GB/s") == Approx(1.25e9));
  CHECK(parse_bandwidth("8000") == Approx(1000));
  CHECK(parse_latency("0.1ms") == Approx(1e-4));
  CHECK(parse_latency("50us") == Approx(5e-5));
  CHECK(parse_latency("0") == 0);
  CHECK_THROWS_WITH(parse_bandwidth("fast"), Catch::Contains("'fast'"));
  CHECK_THROWS_WITH(parse_bandwidth("10xb"), Catch::Contains("unknown unit"));
  CHECK_THROWS_WITH(parse_bandwidth("0mbit"), Catch::Contains("positive"));
  CHECK_THROWS_WITH(parse_latency("3 parsecs"), Catch::Contains("unknown unit"));
  CHECK(kind_from_tag("ALLGATHERV_FINAL") == OpKind::kAllgatherv);
  CHECK(kind_from_tag("ALLGATHER_COUNTS") == OpKind::kAllgather);
  CHECK(kind_from_tag("ISEND_INDEX") == OpKind::kPointToPoint);
}

TEST_CASE("whatif on a dense run: compute, wait and the allreduce's cost, for other rank counts") {
  TempDir dir("whatif_dense");
  write_config(dir.path, "dense");
  // Two ranks, two logged steps; each step one 1 MB allreduce of 4 ms, 1 ms of it waiting. Rank
  // 0's evaluation allreduce is not part of a step.
  std::string log;
  for (int step = 0; step < 2; ++step)
    log += record(step, "dense", "ALLREDUCE_DENSE", 1000000, 1000000, -1, 100000 * step, 100000 * step + 4000, 1000);
  log += record(1, "dense", "ALLREDUCE_EVAL", 8, 8, -1, 300000, 900000, 0);
  write(dir.path / "comm/rank0.jsonl", log);
  write(dir.path / "comm/rank1.jsonl", log);
  write(dir.path / "metrics.jsonl", metrics_record(1, "dense") + metrics_record(2, "dense") +
                                        "{\"split\":\"test\",\"step\":2,\"loss\":1,\"accuracy\":0.5}\n");
  const auto run = measure_run(dir.path.string());
  CHECK(run.ranks == 2);
  CHECK(run.waits_known);
  REQUIRE(run.phases.size() == 1);
  const auto& ph = run.phases[0];
  CHECK(ph.step_ms == Approx(17));
  CHECK(ph.comm_ms == Approx(4));
  CHECK(ph.wait_ms == Approx(1));
  CHECK(ph.compute_ms == Approx(13));
  REQUIRE(ph.ops.size() == 1);  // the evaluation's allreduce is left out

  // P = 2: min(ring 2 x 10 us + 1 ms, doubling 10 us + 1 ms) = 1.01 ms.
  auto p2 = predict(run, kNet, 2);
  REQUIRE(p2.size() == 1);
  CHECK(p2[0].comm_ms == Approx(1.01));
  CHECK(p2[0].step_ms == Approx(13 + 1.01 + 1));
  CHECK(p2[0].efficiency == Approx(13 / 15.01));
  const auto j = nlohmann::json::parse(trainer::app::whatif_json(run, p2, trainer::app::nominal_network(kNet), 2));
  CHECK(j["phases"][0]["step_ms"].get<double>() == Approx(15.01));
  CHECK(j["phases"][0]["measured_step_ms"].get<double>() == Approx(17));
  CHECK(j["measured_ranks"] == 2);
  // P = 4: the ring, 60 us + 1.5 ms; the wait carries over.
  auto p4 = predict(run, kNet, 4);
  CHECK(p4[0].step_ms == Approx(13 + 1.56 + 1));
  CHECK(p4[0].comm_share == Approx(2.56 / 15.56));
  // P = 1: compute alone, E = 1.
  auto p1 = predict(run, kNet, 1);
  CHECK(p1[0].step_ms == Approx(13));
  CHECK(p1[0].efficiency == Approx(1));
}

TEST_CASE("whatif on an oktopk run: messages and the final allgatherv scale as the method's bound says") {
  TempDir dir("whatif_oktopk");
  write_config(dir.path, "oktopk");
  // Two ranks; per step one 4 kB message each way (overlapping: 1 ms of union) and an allgatherv of
  // 8 kB output (1 ms, no wait).
  std::string log;
  for (int step = 0; step < 2; ++step) {
    const int64_t t = 100000 * step;
    log += record(step, "compressed", "ISEND_VALUE", 4000, 0, 1, t, t + 800);
    log += record(step, "compressed", "IRECV_VALUE", 0, 4000, 1, t + 200, t + 1000);
    log += record(step, "compressed", "ALLGATHERV_FINAL", 4000, 4000, -1, t + 2000, t + 3000, 0);
  }
  write(dir.path / "comm/rank0.jsonl", log);
  write(dir.path / "comm/rank1.jsonl", log);
  write(dir.path / "metrics.jsonl", metrics_record(1, "compressed") + metrics_record(2, "compressed"));
  const auto run = measure_run(dir.path.string());
  REQUIRE(run.phases.size() == 1);
  CHECK(run.phases[0].comm_ms == Approx(2));  // 1 ms of messages (union) + 1 ms allgatherv
  CHECK(run.phases[0].compute_ms == Approx(15));
  const double a = kNet.latency, b = kNet.bandwidth;
  // P = 2: one message each way: a + 4000/B; allgatherv: a + 4000/B.
  CHECK(predict(run, kNet, 2)[0].comm_ms == Approx(1e3 * (2 * a + 8000 / b)));
  // P = 4: 3 messages each way carrying 4000 x (3/4)/(1/2) = 6000 B; allgatherv output unchanged
  // (the k global entries): 3a + (3/4) 8000/B.
  CHECK(predict(run, kNet, 4)[0].comm_ms == Approx(1e3 * (3 * a + 6000 / b + 3 * a + 6000 / b)));
}

TEST_CASE("whatif names the missing or malformed file") {
  TempDir dir("whatif_bad");
  CHECK_THROWS_WITH(measure_run(dir.path.string()), Catch::Contains("config.toml"));
  write_config(dir.path, "dense");
  CHECK_THROWS_WITH(measure_run(dir.path.string()), Catch::Contains("comm/rank0.jsonl"));
  write(dir.path / "comm/rank0.jsonl", "{\"step\":0}\n");
  CHECK_THROWS_WITH(measure_run(dir.path.string()), Catch::Contains("rank0.jsonl:1"));
  write(dir.path / "comm/rank0.jsonl", record(0, "dense", "ALLREDUCE_DENSE", 8, 8, -1, 0, 10, 0));
  CHECK_THROWS_WITH(measure_run(dir.path.string()), Catch::Contains("metrics.jsonl"));
}

TEST_CASE("whatif at calibrated rates: allreduce at its own fit, other kinds at the point-to-point fit") {
  TempDir dir("whatif_rates");
  write_config(dir.path, "oktopk");
  // Per step: a 1 MB allreduce, one 4 kB message each way, an allgatherv of 8 kB output.
  std::string log;
  for (int step = 0; step < 2; ++step) {
    const int64_t t = 100000 * step;
    log += record(step, "compressed", "ALLREDUCE_REGION", 1000000, 1000000, -1, t, t + 500, 0);
    log += record(step, "compressed", "ISEND_VALUE", 4000, 0, 1, t + 600, t + 800);
    log += record(step, "compressed", "IRECV_VALUE", 0, 4000, 1, t + 600, t + 900);
    log += record(step, "compressed", "ALLGATHERV_FINAL", 4000, 4000, -1, t + 2000, t + 3000, 0);
  }
  write(dir.path / "comm/rank0.jsonl", log);
  write(dir.path / "comm/rank1.jsonl", log);
  write(dir.path / "metrics.jsonl", metrics_record(1, "compressed") + metrics_record(2, "compressed"));
  const auto run = measure_run(dir.path.string());
  const Network reduce{1e9, 10e-6}, messages{2e8, 40e-6};
  const NetworkRates rates{reduce, messages, {}, 0};
  // P = 2: allreduce 10 us + 1 ms; message 40 us + 4000/B'; allgatherv 40 us + 4000/B'.
  const auto cost = trainer::app::cost_step(run, run.phases[0], rates, 2);
  REQUIRE(cost.ops.size() == 4);
  CHECK(cost.ops[0].seconds_per_call == Approx(10e-6 + 1e6 / 1e9));
  CHECK(cost.ops[3].seconds_per_call == Approx(40e-6 + 4000 / 2e8));
  CHECK(cost.p2p_seconds == Approx(40e-6 + 4000 / 2e8));
  const auto p = predict(run, rates, 2);
  CHECK(p[0].comm_ms == Approx(1e3 * (10e-6 + 1e6 / 1e9 + 2 * (40e-6 + 4000 / 2e8))));
  // One link for all kinds (the nominal form) is the same as equal rates.
  CHECK(predict(run, reduce, 2)[0].comm_ms == Approx(predict(run, NetworkRates{reduce, reduce, {}, 0}, 2)[0].comm_ms));

  // The outputs say which rates they used.
  trainer::app::WhatifNetwork calibrated;
  calibrated.rates = rates;
  calibrated.calibrated = true;
  calibrated.description = "calibrated: test rates, from net.json measured at P=2 on today";
  calibrated.calibration_path = "net.json";
  calibrated.calibration_ranks = 2;
  const auto j = nlohmann::json::parse(trainer::app::whatif_json(run, p, calibrated, 2));
  CHECK(j["network"]["source"] == "calibrated");
  CHECK(j["network"]["calibration"] == "net.json");
  CHECK(j["network"]["messages"]["bandwidth_bytes_per_s"].get<double>() == 2e8);
  CHECK(j["bandwidth_bytes_per_s"].get<double>() == 1e9);  // the allreduce rate, for plots against bandwidth
  const std::string text = trainer::app::whatif_report(run, p, calibrated, 2);
  CHECK_THAT(text, Catch::Contains("rates: calibrated: test rates, from net.json measured at P=2 on today\n"));
  const auto nominal = nlohmann::json::parse(
      trainer::app::whatif_json(run, predict(run, kNet, 2), trainer::app::nominal_network(kNet), 2));
  CHECK(nominal["network"]["source"] == "nominal");
  CHECK_THAT(nominal["network"]["description"].get<std::string>(), Catch::StartsWith("nominal 8 Gbit/s"));
}

TEST_CASE("whatif on an overlapped dense run: buckets laid along backward's timeline") {
  TempDir dir("whatif_overlap");
  write_config(dir.path, "dense");
  // Per step (10 ms of forward and backward from t0): a 1 MB bucket ready at 2 ms and sent 2-6 ms,
  // another ready at 9 ms and sent 9-13 ms, then the 8-byte control allreduce 13-13.1 ms (50 us of
  // it waiting). Measured exposed: 3 ms of the second bucket and the control's 0.1 ms.
  auto with = [](std::string rec, const std::string& extra) { return rec.insert(rec.size() - 2, extra); };
  std::string log;
  for (int step = 0; step < 2; ++step) {
    const int64_t t0 = 100000 * step;
    log += with(record(step, "dense", "ALLREDUCE_DENSE", 1000000, 1000000, -1, t0 + 2000, t0 + 6000, 0),
                ",\"ready_us\":" + std::to_string(t0 + 2000));
    log += with(record(step, "dense", "ALLREDUCE_DENSE", 1000000, 1000000, -1, t0 + 9000, t0 + 13000, 0),
                ",\"ready_us\":" + std::to_string(t0 + 9000));
    log += with(record(step, "dense", "FORWARD_BACKWARD", 0, 0, -1, t0, t0 + 10000), ",\"kind\":\"compute\"");
    log += record(step, "dense", "ALLREDUCE_CONTROL", 8, 8, -1, t0 + 13000, t0 + 13100, 50);
  }
  write(dir.path / "comm/rank0.jsonl", log);
  write(dir.path / "comm/rank1.jsonl", log);
  write(dir.path / "metrics.jsonl", metrics_record(1, "dense") + metrics_record(2, "dense"));
  const auto run = measure_run(dir.path.string());
  REQUIRE(run.phases.size() == 1);
  const auto& ph = run.phases[0];
  REQUIRE(ph.overlap.buckets.size() == 2);
  CHECK(ph.overlap.buckets[0].ready_ms == Approx(2));
  CHECK(ph.overlap.buckets[1].ready_ms == Approx(9));
  CHECK(ph.overlap.buckets[1].size == Approx(1e6));
  CHECK(ph.overlap.backward_ms == Approx(10));
  CHECK(ph.overlap.exposed_ms == Approx(3.1));
  CHECK(ph.compute_ms == Approx(17 - 3.1));  // the communication during backward cost no time
  CHECK(ph.wait_ms == Approx(0.05));         // only the calls after backward

  // A fast link: each bucket takes 1.01 ms (recursive doubling at P = 2), both end inside backward
  // but for 10 us; the control allreduce follows (10 us + 8 ns).
  auto fast = predict(run, kNet, 2);
  CHECK(fast[0].comm_ms == Approx(0.01 + 0.010008));
  CHECK(fast[0].step_ms == Approx(13.9 + 0.020008 + 0.05));
  // A slow link (1 MB/s): 1 s a bucket; the second waits for the first, so 2.002 s - 10 ms is exposed.
  auto slow = predict(run, Network{1e6, 0}, 2);
  CHECK(slow[0].comm_ms == Approx(1992 + 0.008));
}

TEST_CASE("a calibration's measured allreduce times are read off its curve at its P and sizes") {
  NetworkRates rates = NetworkRates::uniform(kNet);
  rates.allreduce_curve = {{1e3, 1e-3}, {1e5, 1e-2}, {1e7, 0.5}};
  rates.curve_ranks = 2;
  CHECK(rates.allreduce_seconds(1e3, 2) == Approx(1e-3));
  CHECK(rates.allreduce_seconds(1e4, 2) == Approx(std::sqrt(1e-3 * 1e-2)));  // halfway in log size and log time
  CHECK(rates.allreduce_seconds(1e6, 2) == Approx(std::sqrt(1e-2 * 0.5)));
  CHECK(rates.allreduce_seconds(1e7, 2) == Approx(0.5));
  // Outside the measured sizes, or at another P: the model's schedule at the fit.
  CHECK(rates.allreduce_seconds(1e8, 2) == Approx(collective_seconds(OpKind::kAllreduce, 1e8, 2, kNet)));
  CHECK(rates.allreduce_seconds(1e4, 4) == Approx(collective_seconds(OpKind::kAllreduce, 1e4, 4, kNet)));
}
