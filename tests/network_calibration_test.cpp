// The network calibration's pieces that need no network: the fit of the model's latency and
// bandwidth (comm/network_fit.h) on times generated from known parameters, the calibration file's
// round trip and its one-line errors (comm/network_calibration.h), and which rates whatif says it
// used (trainer/tools/whatif_network.h). `trainer calibrate` itself runs in calibrate_e2e_test.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "comm/network_calibration.h"
#include "comm/network_fit.h"
#include "comm/network_model.h"
#include "process.h"
#include "trainer/tools/whatif_network.h"

using namespace trainer::comm;
using trainer::testing::TempDir;

namespace {

// Sizes as trainer calibrate's defaults sweep them: 256 B by 4 up to 64 MiB.
std::vector<double> sweep_sizes() {
  std::vector<double> out;
  for (double s = 256; s <= 64.0 * (1 << 20); s *= 4) out.push_back(s);
  return out;
}

std::vector<SizeSample> synthetic(OpKind kind, int ranks, const Network& net, double noise = 0) {
  std::vector<SizeSample> out;
  int i = 0;
  for (double s : sweep_sizes()) {
    const double sign = (i++ % 2) ? 1 : -1;  // alternating, so the noise has no trend of its own
    out.push_back({s, collective_seconds(kind, s, ranks, net) * (1 + sign * noise)});
  }
  return out;
}

NetworkCalibration example_calibration() {
  NetworkCalibration c;
  c.ranks = 2;
  c.hosts = {"node-a", "node-b"};
  c.cpu = "Test CPU";
  c.isa = "avx2";
  c.mpi = "Open MPI v4.1.4";
  c.date = "2026-11-24T07:00:00Z";
  c.nominal_bandwidth = 12.5e6;
  c.repeats = 3;
  c.allreduce = {{256, 20, {1e-4, 1.1e-4, 0.9e-4}, 1e-4}, {4e6, 1, {0.5, 0.52, 0.49}, 0.5}};
  c.p2p = {{256, 30, {0.8e-4, 0.8e-4, 0.9e-4}, 0.8e-4}, {4e6, 1, {0.4, 0.41, 0.42}, 0.41}};
  c.allreduce_fit.network = {8.59e6, 142e-6};
  c.allreduce_fit.max_relative_error = 0.06;
  c.p2p_fit.network = {10.0e6, 95e-6};
  c.p2p_fit.max_relative_error = 0.03;
  return c;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The error of loading `text` as a calibration file: one line naming the file.
std::string load_error(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("bad.json");
  write(path, text);
  try {
    load_calibration(path);
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    CHECK(what.rfind(path + ": ", 0) == 0);
    return what;
  }
  FAIL("no error for: " << text);
  return "";
}

}  // namespace

TEST_CASE("the fit recovers latency and bandwidth from times the model made") {
  const Network truth{8.59e6, 142e-6};  // 68.7 Mbit/s, 142 us
  for (int ranks : {2, 3, 4, 8}) {
    INFO("allreduce, P = " << ranks);
    const AlphaBetaFit fit = fit_network(OpKind::kAllreduce, ranks, synthetic(OpKind::kAllreduce, ranks, truth));
    CHECK(fit.network.bandwidth == Approx(truth.bandwidth).epsilon(1e-9));
    CHECK(fit.network.latency == Approx(truth.latency).epsilon(1e-9));
    CHECK(fit.max_relative_error < 1e-9);
  }
  // P = 4: small buffers by recursive doubling, large ones by the ring; the fit found both.
  CHECK(collective_terms(OpKind::kAllreduce, 256, 4, truth).messages == 2);
  CHECK(collective_terms(OpKind::kAllreduce, 64e6, 4, truth).messages == 6);
  const Network fast{1.1e9, 25e-6};
  const AlphaBetaFit p2p = fit_network(OpKind::kPointToPoint, 4, synthetic(OpKind::kPointToPoint, 4, fast));
  CHECK(p2p.network.bandwidth == Approx(fast.bandwidth).epsilon(1e-9));
  CHECK(p2p.network.latency == Approx(fast.latency).epsilon(1e-9));
}

TEST_CASE("the fit stays close under noise and reports how far the samples are off") {
  const Network truth{125e6, 60e-6};
  const AlphaBetaFit fit = fit_network(OpKind::kAllreduce, 2, synthetic(OpKind::kAllreduce, 2, truth, 0.03));
  CHECK(fit.network.bandwidth == Approx(truth.bandwidth).epsilon(0.05));
  CHECK(fit.network.latency == Approx(truth.latency).epsilon(0.1));
  CHECK(fit.max_relative_error > 0.01);
  CHECK(fit.max_relative_error < 0.1);
}

TEST_CASE("the bandwidth is the large sizes' even when small sizes run faster than their line") {
  // Sizes up to 16 KiB at five times the rate (cache, eager protocol): the line through all sizes
  // would take its slope from them; the large calls, which carry a step's time, keep theirs.
  const Network large{12.5e6, 100e-6}, small{62.5e6, 100e-6};
  std::vector<SizeSample> samples;
  for (double s : sweep_sizes())
    samples.push_back({s, collective_seconds(OpKind::kPointToPoint, s, 2, s <= 16384 ? small : large)});
  const AlphaBetaFit fit = fit_network(OpKind::kPointToPoint, 2, samples);
  CHECK(fit.network.bandwidth == Approx(large.bandwidth).epsilon(1e-3));
  // The latency: what the smallest call's time leaves after its bytes at that rate.
  CHECK(fit.network.latency == Approx(samples[0].seconds - samples[0].bytes / fit.network.bandwidth).epsilon(1e-6));
  CHECK(fit.max_relative_error > 0.3);  // and says the middle sizes are off its line
}

TEST_CASE("the fit refuses samples it cannot fit, saying why") {
  CHECK_THROWS_WITH(fit_network(OpKind::kAllreduce, 2, {{1024, 1e-3}}), Catch::Contains("two different sizes"));
  CHECK_THROWS_WITH(fit_network(OpKind::kAllreduce, 2, {{1024, 1e-3}, {2048, 1e-3}}),
                    Catch::Contains("no bandwidth to fit"));
  // Larger sizes faster than the smallest one's latency (a scheduler stall in the smallest).
  CHECK_THROWS_WITH(fit_network(OpKind::kPointToPoint, 2, {{256, 1e-3}, {65536, 0.5e-3}, {131072, 1.01e-3}}),
                    Catch::Contains("no bandwidth to fit"));
  CHECK_THROWS_WITH(fit_network(OpKind::kAllreduce, 2, {{1024, 0}, {2048, 1e-3}}), Catch::Contains("positive"));
}

TEST_CASE("a calibration file reads back as it was written") {
  TempDir dir("calibration_roundtrip");
  const NetworkCalibration c = example_calibration();
  const std::string path = dir.file("net.json");
  save_calibration(c, path);
  const NetworkCalibration r = load_calibration(path);
  CHECK(r.ranks == c.ranks);
  CHECK(r.hosts == c.hosts);
  CHECK(r.cpu == c.cpu);
  CHECK(r.isa == c.isa);
  CHECK(r.mpi == c.mpi);
  CHECK(r.date == c.date);
  CHECK(r.nominal_bandwidth == c.nominal_bandwidth);
  CHECK(r.repeats == c.repeats);
  REQUIRE(r.allreduce.size() == 2);
  REQUIRE(r.p2p.size() == 2);
  CHECK(r.allreduce[1].bytes == 4e6);
  CHECK(r.allreduce[0].calls_per_sample == 20);
  CHECK(r.p2p[1].samples_s == c.p2p[1].samples_s);
  CHECK(r.p2p[1].median_s == c.p2p[1].median_s);
  CHECK(r.allreduce_fit.network.bandwidth == c.allreduce_fit.network.bandwidth);
  CHECK(r.allreduce_fit.network.latency == c.allreduce_fit.network.latency);
  CHECK(r.allreduce_fit.max_relative_error == c.allreduce_fit.max_relative_error);
  CHECK(r.p2p_fit.network.bandwidth == c.p2p_fit.network.bandwidth);
  CHECK(r.p2p_fit.network.latency == c.p2p_fit.network.latency);
  CHECK(r.rates().allreduce.bandwidth == c.allreduce_fit.network.bandwidth);
  CHECK(r.rates().for_kind(OpKind::kAllgatherv).bandwidth == c.p2p_fit.network.bandwidth);
  CHECK(describe_rates(r) == "68.7 Mbit/s achieved allreduce bus rate, 142 us latency (69% of the nominal 100 Mbit/s); "
                             "point to point 80 Mbit/s, 95 us");
}

TEST_CASE("a bad calibration file is one line naming the file and the key") {
  TempDir dir("calibration_bad");
  const std::string missing = dir.file("absent.json");
  CHECK_THROWS_WITH(load_calibration(missing), Catch::StartsWith(missing + ": cannot open"));
  CHECK_THAT(load_error(dir, "{not json"), Catch::Contains("not JSON"));
  CHECK_THAT(load_error(dir, "{\"format\": \"safetensors\"}"), Catch::Contains("not a network calibration"));
  nlohmann::json good = nlohmann::json::parse(calibration_to_json(example_calibration()));
  auto with = [&](auto edit) {
    nlohmann::json j = good;
    edit(j);
    return load_error(dir, j.dump());
  };
  CHECK_THAT(with([](nlohmann::json& j) { j["version"] = 2; }), Catch::Contains("'version'") && Catch::Contains("1"));
  CHECK_THAT(with([](nlohmann::json& j) { j["fit"]["allreduce"].erase("bandwidth_bytes_per_s"); }),
             Catch::Contains("key 'fit.allreduce.bandwidth_bytes_per_s' missing"));
  CHECK_THAT(with([](nlohmann::json& j) { j["fit"]["p2p"]["latency_s"] = -1e-6; }),
             Catch::Contains("'fit.p2p.latency_s' must not be negative"));
  CHECK_THAT(with([](nlohmann::json& j) { j["fit"]["p2p"]["bandwidth_bytes_per_s"] = "fast"; }),
             Catch::Contains("'fit.p2p.bandwidth_bytes_per_s' must be a number"));
  CHECK_THAT(with([](nlohmann::json& j) { j["ranks"] = 1; }), Catch::Contains("'ranks'"));
  CHECK_THAT(with([](nlohmann::json& j) { j["measurements"]["p2p"][1].erase("median_s"); }),
             Catch::Contains("'measurements.p2p[1].median_s' missing"));
}

TEST_CASE("whatif says which rates it used: nominal, calibrated, extrapolated") {
  TempDir dir("calibration_whatif");
  const std::string path = dir.file("net.json");
  save_calibration(example_calibration(), path);
  using trainer::app::whatif_network;
  const auto nominal = whatif_network("100mbit", "130us", "", 2);
  CHECK_FALSE(nominal.calibrated);
  CHECK_THAT(nominal.description, Catch::StartsWith("nominal 100 Mbit/s, latency 130 us"));
  CHECK(nominal.rates.allreduce.bandwidth == Approx(12.5e6));
  CHECK(nominal.rates.messages.latency == Approx(130e-6));
  const auto same_p = whatif_network("", "", path, 2);
  CHECK(same_p.calibrated);
  CHECK_THAT(same_p.description,
             Catch::StartsWith("calibrated: 68.7 Mbit/s achieved allreduce bus rate, 142 us latency") &&
                 Catch::Contains("from " + path + " measured at P=2 on 2026-11-24T07:00:00Z"));
  CHECK(same_p.extrapolation.empty());
  CHECK(same_p.rates.allreduce.bandwidth == 8.59e6);
  CHECK(same_p.rates.messages.bandwidth == 10.0e6);
  const auto other_p = whatif_network("", "", path, 4);
  CHECK_THAT(other_p.extrapolation, Catch::StartsWith("extrapolated from P=2 to P=4"));
  CHECK_THROWS_WITH(whatif_network("1gbit", "", path, 2), Catch::Contains("not both"));
  CHECK_THROWS_WITH(whatif_network("", "", "", 2), Catch::Contains("--calibration"));
  CHECK_THROWS_WITH(whatif_network("", "", dir.file("absent.json"), 2), Catch::Contains("absent.json: cannot open"));
  CHECK_THROWS_WITH(whatif_network("fast", "", "", 2), Catch::Contains("'fast'"));
}
