// `trainer whatif RUN_DIR (--bandwidth B --latency L | --calibration FILE) [--ranks P]`: the step time a
// finished run would have on another network and rank count, from what it measured
// (comm/network_model.h costs each call; trainer/tools/whatif_network.h says at which rates: nominal, or
// calibrated by `trainer calibrate`).
//
// What is measured, per phase (dense, compressed), following rank 0 (its times are the ones
// metrics.jsonl holds; in synchronous training every rank's mean step time is the same, and rank
// 0's wait absorbs the other ranks' imbalance):
//   step time    median over metrics.jsonl step records of t_data + t_compute + t_sync + t_optim
//   comm time    per logged step, the union of rank 0's call intervals (messages overlap), median
//   compute      step time - comm time: data, forward/backward, optimizer and the sync method's
//                local work (selection, packing), carried over unchanged
//   wait         rank 0's wait_us per step (comm_wait.h), median, carried over unchanged
//   ops          per op tag: calls per step and data size S per call
// Calls outside the training step (evaluation, checkpoints, the start-up checks: ALLREDUCE_EVAL,
// ALLREDUCE_CHECK, CHECKPOINT_*, BARRIER_SETUP) are left out.
//
// Predicted step time = compute + wait + the sum of the model's costs of the step's calls, with
// messages of the step costed together (p2p_seconds). With --ranks P' the sizes change with P' as
// the method's schedule says (assumptions, per kind):
//   allreduce, broadcast   S unchanged (the gradient, a bucket, a control value)
//   allgather              S * P'/P (one equal block per rank)
//   allgatherv             a method whose spec says fixed_gather_total (oktopk: the k globally
//                          selected entries, whatever P): unchanged; other methods: S * P'/P
//                          (every rank contributes its own k)
//   alltoall               S * P'/P (one block per rank pair)
//   messages (oktopk's split-and-reduce: each rank sends what falls in other ranks' regions)
//                          count * (P'-1)/(P-1), bytes * ((P'-1)/P') / ((P-1)/P)
// Per-rank batch stays the same (weak scaling), so compute per step is unchanged and the scaling
// efficiency per sample is E(P') = T(1) / T(P') = compute / predicted step time.
//
// The step's calls are costed one by one (cost_step) and then composed: serially, one after another
// after backward (CostedStep::serial_seconds), which is how every method but overlapped dense
// buckets runs them. Buckets that went out during backward (sync.overlap; their records carry
// ready_us) are laid along the measured step's timeline instead (whatif_overlap.h): only what they
// leave exposed after backward counts, and the measured compute is the step minus the measured
// exposed communication.
#pragma once

#include <string>
#include <vector>

#include "comm/comm_log.h"
#include "comm/network_model.h"
#include "trainer/tools/whatif_network.h"
#include "trainer/tools/whatif_overlap.h"

namespace trainer::app {

struct OpMeasurement {
  std::string op;
  comm::OpKind kind = comm::OpKind::kOther;
  double calls_per_step = 0;
  double size_per_call = 0;  // mean data size S (messages: bytes of the message)
  double sent_per_step = 0, received_per_step = 0;  // messages: bytes each way
  double sends_per_step = 0, receives_per_step = 0;
  double measured_ms_per_step = 0;  // summed call time (messages overlap, so not additive)
  double wait_ms_per_step = 0;
  bool overlapped = false;  // its calls went out during backward (costed on the timeline: whatif_overlap.h)
};

struct PhaseMeasurement {
  std::string phase;        // "dense" or "compressed"
  int64_t logged_steps = 0;  // steps of rank 0's comm log in this phase
  int64_t metric_records = 0;
  double step_ms = 0;       // measured (metrics.jsonl)
  double comm_ms = 0;       // union of call intervals per step
  double wait_ms = 0;
  double compute_ms = 0;    // step_ms - comm_ms (overlapped: step_ms - overlap.exposed_ms)
  std::vector<OpMeasurement> ops;
  OverlapMeasurement overlap;  // the buckets sent during backward, if any
};

struct RunMeasurement {
  std::string run_dir, method;
  int ranks = 0;
  bool waits_known = false;  // the log has wait_us (the run ended normally)
  std::vector<PhaseMeasurement> phases;
};

struct PhasePrediction {
  std::string phase;
  double compute_ms = 0, comm_ms = 0, wait_ms = 0, step_ms = 0;
  double comm_share = 0;  // (comm + wait) / step
  double efficiency = 0;  // E(P) = compute / step
  double measured_step_ms = 0;
};

// One op of a phase's step as the model costs it with P' ranks: calls per step, each of this data
// size (scaled to P' as above) and this many seconds at the rates of its kind
// (comm::NetworkRates::for_kind). Messages are costed together for the step instead (they share the
// link both ways: CostedStep::p2p_seconds); their entries carry seconds_per_call = 0.
struct CostedOp {
  std::string op;
  comm::OpKind kind = comm::OpKind::kOther;
  double calls_per_step = 0;
  double size_per_call = 0;
  double seconds_per_call = 0;
  bool overlapped = false;
};

struct CostedStep {
  std::vector<CostedOp> ops;
  double p2p_seconds = 0;  // the step's messages together (comm::p2p_seconds' formula on mean counts)

  // The calls one after another, none overlapping compute: the step's communication time today.
  // When the comm log carries, per dense bucket call, the time backward made the bucket ready
  // (overlap with backward), a timeline composition replaces this sum: walk the step's calls in
  // order, each starting at max(its ready time, the previous call's end) and lasting its
  // seconds_per_call; what is exposed is the last call's end past backward's end. That needs the
  // calls one by one (per call ready time and size) where measure_run now keeps per-op means.
  double serial_seconds() const;
  // The same without the overlapped ops (those are on the timeline).
  double serial_seconds_after_backward() const;
};

// The model's cost of each call of one measured phase with `ranks` ranks.
CostedStep cost_step(const RunMeasurement& run, const PhaseMeasurement& phase, const comm::NetworkRates& rates,
                     int ranks);

// Reads RUN_DIR/config.toml, metrics.jsonl and comm/rank0.jsonl. Throws std::runtime_error naming
// the file when one is missing or malformed, or when the log has no training step.
RunMeasurement measure_run(const std::string& run_dir);

// The model's step time for each measured phase at `rates` with `ranks` ranks (compute + wait +
// cost_step(...).serial_seconds()). The Network form costs every kind on that one link.
std::vector<PhasePrediction> predict(const RunMeasurement& run, const comm::NetworkRates& rates, int ranks);
std::vector<PhasePrediction> predict(const RunMeasurement& run, const comm::Network& net, int ranks);

// `trainer whatif --json`: the run, the network and one object per phase with the fields of
// PhasePrediction (compute_ms, comm_ms, wait_ms, step_ms, comm_share, efficiency, measured_step_ms).
// The network: bandwidth_bytes_per_s and latency_s (allreduce's rates) and "network" with its
// source ("nominal" or "calibrated"), description, extrapolation, per-kind rates and, when
// calibrated, the file, its P and date.
std::string whatif_json(const RunMeasurement& run, const std::vector<PhasePrediction>& predictions,
                        const WhatifNetwork& network, int ranks);

// The text `trainer whatif` prints; its first lines say which rates were used.
std::string whatif_report(const RunMeasurement& run, const std::vector<PhasePrediction>& predictions,
                          const WhatifNetwork& network, int ranks);

}  // namespace trainer::app
