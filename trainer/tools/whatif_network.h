// The network `trainer whatif` (and the report's scalability view, through it) predicts on, and the
// sentence that says which rates those are, printed with every prediction: a link's nominal rate
// (--bandwidth, --latency), which an MPI library over TCP may reach only part of, or the rates
// `trainer calibrate` measured (--calibration FILE, comm/network_calibration.h).
#pragma once

#include <string>

#include "comm/network_calibration.h"
#include "comm/network_model.h"

namespace trainer::app {

struct WhatifNetwork {
  comm::NetworkRates rates;
  bool calibrated = false;
  // "nominal 100 Mbit/s, latency 130 us" or "calibrated: 68.7 Mbit/s achieved allreduce bus rate,
  // 142 us latency; point to point ..., from FILE measured at P=2 on DATE".
  std::string description;
  // Empty, or how a calibration made at P ranks is carried to the predicted P'.
  std::string extrapolation;
  std::string calibration_path, calibration_date;
  int calibration_ranks = 0;
};

WhatifNetwork nominal_network(const comm::Network& net);

// `ranks`: the rank count predicted for.
WhatifNetwork calibrated_network(const comm::NetworkCalibration& calibration, const std::string& path, int ranks);

// From whatif's options: a calibration file when one is given, else the nominal bandwidth and
// latency. Throws std::runtime_error (one line) when neither or both are given, or the file or a
// unit is bad.
WhatifNetwork whatif_network(const std::string& bandwidth, const std::string& latency, const std::string& calibration,
                             int ranks);

}  // namespace trainer::app
