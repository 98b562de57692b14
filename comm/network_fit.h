// Fitting the network model's two parameters (comm/network_model.h: latency alpha and bandwidth B)
// to measured times of one kind of call, so that the model reproduces what the MPI library
// achieved on a real network rather than the link's nominal rate (`trainer calibrate`).
//
// The samples are median times of one call at several data sizes S on P ranks. The model's cost is
// linear in (alpha, 1/B) once the algorithm is fixed (collective_terms: messages * alpha + bytes /
// B). Each parameter comes from the sizes it dominates:
//   latency    from the smallest size: what its time leaves after its bytes at the bandwidth;
//   bandwidth  least squares of absolute residuals over the larger half of the sizes (at least
//              two), at that latency;
// alternating until both settle.
//
// Why not one least-squares line through all sizes: a real library's curve is not one line. Sizes
// that stay in cache, go by an eager protocol or fit a token bucket's burst run faster than the
// line through the large ones, and with sizes spread evenly over four decades those many small
// sizes set the slope (on this machine's shared memory, relative least squares over 256 B .. 64 MB
// gave 56 Gbit/s where 16 and 64 MB achieve 10; under scripts/netem at 100 Mbit/s, messages up to
// tc's 64 kB burst pass at the full rate and 1-4 MB at about half). Absolute residuals weigh each
// size as much as its time, as a step does: a step's communication time is mostly its largest
// calls (a dense gradient's buckets), whose rate must be right, while its small calls (control
// values, counts) cost their latency. No intercept of its own: on a loaded machine a few ms lost
// to the scheduler in one sample can tilt a free line through a few sizes flat or negative.
// max_relative_error says how far the sizes in between are off the line.
//
// Where the model chooses the algorithm by size (allreduce: recursive doubling for small buffers,
// the ring for large), the choice depends on the parameters, so the fit alternates: choose each
// sample's algorithm with the current parameters, fit, repeat until no choice changes. A latency
// below zero is clamped to zero.
#pragma once

#include <vector>

#include "comm/comm_log.h"
#include "comm/network_model.h"

namespace trainer::comm {

struct SizeSample {
  double bytes = 0;    // data size S of the call (comm_summary.h's definition)
  double seconds = 0;  // its measured time (median of repeats)
};

struct AlphaBetaFit {
  Network network;
  double max_relative_error = 0;  // max over samples of |model - measured| / measured
  int iterations = 0;             // alternations until the algorithm choices settled
};

// Throws std::invalid_argument when fewer than two distinct sizes are given, a time is not
// positive, or the times do not grow with size (no bandwidth to fit: the sizes are too small).
AlphaBetaFit fit_network(OpKind kind, int ranks, const std::vector<SizeSample>& samples);

}  // namespace trainer::comm
