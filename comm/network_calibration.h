// A measured network: what `trainer calibrate` (comm/calibrate.h) found the MPI library achieving
// between P ranks, and the network model's parameters fitted to it (comm/network_fit.h), stored as
// one JSON file that `trainer whatif --calibration` and `trainer report --calibration` read instead
// of a nominal link rate.
//
// The file (format "trainer network calibration", version 1):
//   ranks, hosts (one per rank), cpu (rank 0's model name), isa (oneDNN's, rank 0), mpi (library
//   version), date (UTC, ISO 8601), nominal_bandwidth_bytes_per_s (what the link is said to be;
//   0: not given), repeats;
//   measurements: {allreduce: [...], p2p: [...]}, each entry {bytes, calls_per_sample, samples_s:
//     [one per repeat: the slowest rank's mean time per call], median_s};
//   fit: {allreduce: {...}, p2p: {...}}, each {latency_s, bandwidth_bytes_per_s,
//     max_relative_error}.
// The allreduce samples are MPI_Allreduce of floats (sum, in place) as dense sync calls it; the p2p
// samples a ring shift (every rank sends S bytes to the next rank and receives S from the previous
// one at once), which loads each link both ways as the sparse methods' messages do. whatif uses the
// stored fit; the measurements are there to check it or fit again.
#pragma once

#include <string>
#include <vector>

#include "comm/network_fit.h"
#include "comm/network_model.h"

namespace trainer::comm {

struct CalibrationSize {
  double bytes = 0;
  int calls_per_sample = 1;        // back-to-back calls timed together (small sizes)
  std::vector<double> samples_s;   // per repeat: seconds per call, the slowest rank's
  double median_s = 0;
};

struct NetworkCalibration {
  int ranks = 0;
  std::vector<std::string> hosts;
  std::string cpu, isa, mpi, date;
  double nominal_bandwidth = 0;  // bytes/s; 0 when the user did not say
  int repeats = 0;
  std::vector<CalibrationSize> allreduce, p2p;
  AlphaBetaFit allreduce_fit, p2p_fit;

  // The rates whatif costs calls at (network_model.h: allreduce its own fit, everything else p2p's).
  NetworkRates rates() const { return {allreduce_fit.network, p2p_fit.network, {}, 0}; }
};

std::string calibration_to_json(const NetworkCalibration& calibration);  // one object, indented

// Writes `path` (through a temporary name, so a reader never sees half a file). Throws
// std::runtime_error naming the path when it cannot.
void save_calibration(const NetworkCalibration& calibration, const std::string& path);

// Reads and checks a file save_calibration wrote. Throws std::runtime_error with one line naming the
// path and, where it is one, the key: missing file, not JSON, another format or version, a missing
// or mistyped key, a latency below zero or a rate that is not positive.
NetworkCalibration load_calibration(const std::string& path);

// "68.7 Mbit/s achieved allreduce bus rate, 142 us latency (point to point: 80.1 Mbit/s, 95 us)",
// with "(69% of the nominal 100 Mbit/s)" when the file knows the nominal rate.
std::string describe_rates(const NetworkCalibration& calibration);

// "100 Mbit/s", "1.25 Gbit/s" (bits, as links are sold) from bytes per second.
std::string format_rate(double bytes_per_second);

}  // namespace trainer::comm
