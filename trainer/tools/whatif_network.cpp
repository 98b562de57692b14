#include "trainer/tools/whatif_network.h"

#include <cstdio>
#include <stdexcept>

namespace trainer::app {

WhatifNetwork nominal_network(const comm::Network& net) {
  WhatifNetwork w;
  w.rates = comm::NetworkRates::uniform(net);
  char latency[48];
  std::snprintf(latency, sizeof latency, "%.4g us", net.latency * 1e6);
  w.description = "nominal " + comm::format_rate(net.bandwidth) + ", latency " + latency +
                  " (the link's rate as given, not measured)";
  return w;
}

WhatifNetwork calibrated_network(const comm::NetworkCalibration& c, const std::string& path, int ranks) {
  WhatifNetwork w;
  w.rates = c.rates();
  for (const comm::CalibrationSize& s : c.allreduce) w.rates.allreduce_curve.emplace_back(s.bytes, s.median_s);
  w.rates.curve_ranks = c.ranks;
  w.calibrated = true;
  w.calibration_path = path;
  w.calibration_date = c.date;
  w.calibration_ranks = c.ranks;
  w.description = "calibrated: " + comm::describe_rates(c) + ", from " + path + " measured at P=" +
                  std::to_string(c.ranks) + " on " + c.date +
                  (ranks == c.ranks ? "; allreduces of the measured sizes at their measured times" : "");
  if (ranks != c.ranks) {
    // The fit gives a per-message latency and a per-link rate; the model's schedules carry them to
    // another P. What it cannot know is whether the library reaches the same share of the link
    // there (other algorithms, more connections per rank): say so.
    w.extrapolation = "extrapolated from P=" + std::to_string(c.ranks) + " to P=" + std::to_string(ranks) +
                      " by the model's schedules (allreduce: ring or recursive doubling; comm/network_model.h) "
                      "with the fitted latency and per-link rates unchanged, which assumes the MPI library reaches "
                      "the same share of the link at P=" + std::to_string(ranks) + " (calibrate at that P to check)";
  }
  return w;
}

WhatifNetwork whatif_network(const std::string& bandwidth, const std::string& latency, const std::string& calibration,
                             int ranks) {
  if (!calibration.empty()) {
    if (!bandwidth.empty() || !latency.empty())
      throw std::runtime_error("trainer whatif: give --calibration FILE or --bandwidth/--latency, not both");
    return calibrated_network(comm::load_calibration(calibration), calibration, ranks);
  }
  if (bandwidth.empty())
    throw std::runtime_error("trainer whatif: give --bandwidth B [--latency L] (the link's nominal rate) or "
                             "--calibration FILE (measured with trainer calibrate)");
  try {
    return nominal_network({comm::parse_bandwidth(bandwidth), comm::parse_latency(latency.empty() ? "0" : latency)});
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("trainer whatif: ") + e.what());
  }
}

}  // namespace trainer::app
