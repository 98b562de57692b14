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
#pragma once

#include <cstdint>
#include <string>

#include "comm/comm_log.h"

namespace trainer::comm {

struct Network {
  double bandwidth = 0;  // bytes per second, per direction of each rank's link
  double latency = 0;    // seconds per message (alpha)
};

// Seconds for one call of `kind` with data size `size_bytes` on `ranks` ranks (0 for one rank;
// kOther is costed as a message).
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
