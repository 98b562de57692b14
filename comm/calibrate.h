// `mpiexec -n P trainer calibrate --out FILE.json`: measures once what the MPI library achieves on
// this job's network (allreduces and point-to-point messages over a range of sizes, each repeated,
// the median of the slowest rank's times), fits the network model's latency and bandwidth to each
// kind (comm/network_fit.h) and writes comm/network_calibration.h's file, for `trainer whatif
// --calibration` to predict with what the network gives rather than what the link is sold as.
//
// Sizes grow by `size_factor` from min_bytes and stop after the first whose median call takes more
// than max_call_seconds (or at max_bytes), so the sweep reaches well into the bandwidth-bound sizes
// on any network and stays short on a slow one (a median 23 s at 100 Mbit/s with P = 2 inside
// scripts/netem on the loaded 2-core VM, setup included).
#pragma once

#include <string>

#include "comm/communicator.h"
#include "comm/network_calibration.h"

namespace trainer::comm {

struct CalibrateOptions {
  std::string out;  // the JSON file rank 0 writes
  double min_bytes = 256;
  double max_bytes = 64.0 * (1 << 20);
  double size_factor = 4;
  int repeats = 5;
  double max_call_seconds = 0.25;
  std::string nominal;  // the link's nominal rate ("100mbit"), recorded for comparison only; empty: not given
};

// Collective over `comm` (P >= 2): measures both kinds and fits them. Every rank returns the same
// measurements and fit. Throws std::invalid_argument for bad options (the same on every rank, before
// any traffic) and for a fit that fails (the same data on every rank).
NetworkCalibration measure_network(Communicator& comm, const CalibrateOptions& options);

// The short table `trainer calibrate` prints: per kind and size the median, the fit and the error,
// then the fitted parameters.
std::string calibration_table(const NetworkCalibration& calibration);

// The command: MPI_COMM_WORLD, measure, rank 0 prints the table and writes options.out. Returns the
// exit status; an error is one line, printed by rank 0 only (every rank has the same one).
int run_calibrate(const CalibrateOptions& options);

}  // namespace trainer::comm
