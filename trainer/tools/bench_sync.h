// `trainer bench sync`: the gradient-sync methods on synthetic gradients, and the selection kernel
// alone (docs/architecture.md section 8: benchmarks print measurements and ratios, never pass/fail).
//
// Gradients: per rank and step, 0.5 x a normal vector shared by all ranks + a per-rank normal
// vector (windows of two pre-generated pools at offsets that change every step; filling the
// gradient is not timed). Error feedback runs as in training, so the residual and the reused
// thresholds evolve; `warmup` compressed steps run untimed first.
//
// Per method (dense, topka, gaussiank, gtopk, oktopk, powersgd): the time of a step is the slowest rank's
// reduce() after a barrier; the table shows the median over the timed steps, separately over the
// steps that reuse an estimate and those that compute it afresh for a method whose steps say which
// (SyncStats::fresh_estimate: oktopk's thresholds, either one exact), the bytes each rank sent and
// received per step (the comm log's totals: collectives count this rank's own block, see
// communicator.h), the ratio to the volume the method states (GradientSync::wire_volume), and, for
// a method that says what it selected, the selected counts over k. No method is named here: what
// differs is the method's to say. A method the factory refuses here (gtopk on a P that is not a
// power of two) is skipped with its reason.
// A layer-wise method (its spec's layer_wise: powersgd) runs on the DeepSpeech model's tensor shapes
// (n must be its 27,569,568), once per rank in powersgd_ranks if it has a rank key; then, when torch_script is
// set, rank 0 runs it (PyTorch DDP with powerSGD_hook, gloo on CPU, the same shapes, world size
// and threads per rank) while the other ranks wait, and prints both sides with the ratio.
// Selection (rank 0 alone while the others wait in a barrier; 1 thread and all threads): the
// exact top-k selection and the threshold pass on one n-float buffer, the fused
// grad + residual pass, against one streaming read of the buffer and std::nth_element.
// On a device (--device cuda: `backend` set) each rank's gradient lives in the device's memory,
// the methods run on device buffers (the sparse ones' passes and PowerSGD as device ops, their
// collectives on the device communicator), each step's clock stops after the device is done, and
// the selection kernel alone (a CPU measurement) is skipped; with torch_sparse_script set, rank 0
// then times PyTorch's compression on the same device (error feedback, selection by threshold and
// by torch.topk, packing, the residual's clears: the part of a step our sparse passes do).
// Rank 0 prints the tables and one JSON line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/backend.h"

namespace trainer::comm {

struct SyncBenchOptions {
  int64_t n = 27569568;  // the paper's LSTM (DeepSpeech) model
  double density = 0.02;
  int warmup = 32;  // compressed steps before timing (residuals and thresholds settle)
  int steps = 64;   // timed steps per method (oktopk: exact steps at multiples of 32)
  std::vector<std::string> methods = {"dense", "topka", "gaussiank", "gtopk", "oktopk", "powersgd"};
  bool selection = true;  // also the selection kernel alone
  std::vector<int64_t> powersgd_ranks = {1, 2, 4};
  std::string torch_python = "/usr/bin/python3";
  std::string torch_script;  // scripts/bench_torch_powersgd.py; empty: no PyTorch side
  // Where the buffers live: null or a host backend, the host; else a device's (see above).
  models::Backend* backend = nullptr;
  std::string device = "cpu";             // its runtime.device name (what the torch script gets)
  std::string communicator = "auto";      // runtime.communicator on a device
  std::string torch_sparse_script;        // scripts/bench_torch_sparse.py; empty: none
};

// Collective over world(). Returns the process exit code (0; 2 for bad options).
int run_sync_bench(const SyncBenchOptions& options);

}  // namespace trainer::comm
