// `trainer bench sync`: the gradient-sync methods on synthetic gradients, and the selection kernel
// alone (DESIGN.md section 8: benchmarks print measurements and ratios, never pass/fail).
//
// Gradients: per rank and step, 0.5 x a normal vector shared by all ranks + a per-rank normal
// vector (windows of two pre-generated pools at offsets that change every step; filling the
// gradient is not timed). Error feedback runs as in training, so the residual and the reused
// thresholds evolve; `warmup` compressed steps run untimed first.
//
// Per method (dense, topka, gaussiank, gtopk, oktopk): the time of a step is the slowest rank's
// reduce() after a barrier; the table shows the median over the timed steps, for oktopk separately
// over threshold-reuse steps and exact-recompute steps (either threshold exact), the bytes each
// rank sent and received per step (the comm log's totals: collectives count this rank's own
// block, see communicator.h), and the ratio to the method's volume in DESIGN.md section 4.
// Selection (rank 0 alone while the others wait in a barrier; 1 thread and all threads): the
// exact top-k selection and the threshold pass on one n-float buffer, the fused
// grad + residual pass, against one streaming read of the buffer and std::nth_element.
// Rank 0 prints the tables and one JSON line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::comm {

struct SyncBenchOptions {
  int64_t n = 27569568;  // the paper's LSTM (DeepSpeech) model
  double density = 0.02;
  int warmup = 32;  // compressed steps before timing (residuals and thresholds settle)
  int steps = 64;   // timed steps per method (oktopk: exact steps at multiples of 32)
  std::vector<std::string> methods = {"dense", "topka", "gaussiank", "gtopk", "oktopk"};
  bool selection = true;  // also the selection kernel alone
};

// Collective over world(). Returns the process exit code (0; 2 for bad options).
int run_sync_bench(const SyncBenchOptions& options);

}  // namespace trainer::comm
