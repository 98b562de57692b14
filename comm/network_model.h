// An alpha-beta model of the network: a message of n bytes between two ranks takes
// alpha + n / bandwidth (Hockney), and each collective costs what its algorithm's message schedule
// adds up to on P ranks, with S the call's data size as the log counts it (nccl-tests' S):
//
//   allreduce    min of ring (reduce-scatter + allgather): 2(P-1) alpha + 2 (P-1)/P S/B
//                and recursive doubling (small buffers): ceil(log2 P) (alpha + S/B)
//   allgather(v) ring: (P-1) alpha + (P-1)/P S/B          (S: the whole output)
//   alltoall     pairwise exchange: (P-1) (alpha + S/(P B))  (S: the whole send buffer)
//   broadcast    binomial tree: ceil(log2 P) (alpha + S/B)
//   barrier      dissemination: ceil(log2 P) alpha
//   p2p          alpha + n/B per message
//
// Links are full duplex and every rank has one (the switch is not a bottleneck), which is what
// scripts/netem builds. The minimum for allreduce stands for the MPI library choosing the faster
// algorithm for the size. Real libraries have more algorithms (Rabenseifner, segmented rings, trees);
// this model is the textbook bound, accurate where bandwidth or latency dominates.
// alpha and B are a link's nominal figures, or those `trainer calibrate` fitted to what the MPI
// library achieved on the real network (comm/network_calibration.h); for allreduce that B is the
// achieved bus bandwidth in nccl-tests' sense (S/t x 2(P-1)/P for the ring).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_log.h"

namespace trainer::comm {

struct Network {
  double bandwidth = 0;  // bytes per second, per direction of each rank's link
  double latency = 0;    // seconds per message (alpha)
};

// The rates calls are costed at, per kind of traffic. A nominal network is one link for every
// kind; a calibration (comm/network_calibration.h) gives allreduce the latency and bus rate it
// achieved and every other kind (messages, and the collectives Open MPI builds from them) the
// point-to-point fit, because the library reaches a different share of the link in each.
struct NetworkRates {
  Network allreduce;
  Network messages;  // point to point, and the collectives other than allreduce
  // A calibration's measured allreduce times (bytes, seconds per call) at `curve_ranks` ranks, in
  // increasing size. An MPI library's achieved rate depends on the size (its algorithm and the
  // transport switch protocols: on the emulated 1 Gbit/s link 650 Mbit/s at 4 MB, 950 at 64 MB),
  // which one alpha-beta line cannot follow; at that P and within the measured sizes an allreduce
  // is read off the curve.
  std::vector<std::pair<double, double>> allreduce_curve;
  int curve_ranks = 0;
  static NetworkRates uniform(const Network& net) { return {net, net, {}, 0}; }
  const Network& for_kind(OpKind kind) const { return kind == OpKind::kAllreduce ? allreduce : messages; }
  // Seconds for one allreduce of `size_bytes` on `ranks` ranks: the measured curve (interpolated
  // linearly in log size and log time) where it applies, else the model's schedule at the fit.
  double allreduce_seconds(double size_bytes, int ranks) const;
};

// A call's cost as counts of the model's two parameters: seconds = messages * latency + bytes /
// bandwidth along the critical path. Kept apart from the seconds so that a fit
// (comm/network_fit.h) can solve for latency and bandwidth from measured times.
struct AlphaBetaTerms {
  double messages = 0;
  double bytes = 0;
  double seconds(const Network& net) const { return messages * net.latency + bytes / net.bandwidth; }
};

// The terms of one call of `kind` with data size `size_bytes` on `ranks` ranks (none for one rank;
// kOther is costed as a message). Where the model has a choice of algorithm (allreduce: ring or
// recursive doubling) `net` decides it: the cheaper one on that network.
AlphaBetaTerms collective_terms(OpKind kind, double size_bytes, int ranks, const Network& net);

// Seconds for one call: collective_terms(...).seconds(net).
double collective_seconds(OpKind kind, double size_bytes, int ranks, const Network& net);

// Seconds for a rank's point-to-point traffic of one step: its messages share its link, sends and
// receives each way at once: max(sends, receives) alpha + max(sent, received)/B.
double p2p_seconds(int64_t sends, int64_t receives, double sent_bytes, double received_bytes, const Network& net);

// The op kind of a log record from its tag (docs/architecture.md's naming: ALLREDUCE_*, ALLGATHERV_*,
// ALLGATHER_*, ALLTOALL_*, BROADCAST_*, BARRIER_*, ISEND_*/IRECV_*); kOther for anything else.
OpKind kind_from_tag(const std::string& op);

// "100mbit", "1gbit", "10Gbit", "1e9" (bits/s), "125MB/s", "1.25GB/s" (bytes/s) -> bytes per second.
// "0.1ms", "50us", "1s", "0" -> seconds. Throw std::invalid_argument naming the text.
double parse_bandwidth(const std::string& text);
double parse_latency(const std::string& text);

}  // namespace trainer::comm
