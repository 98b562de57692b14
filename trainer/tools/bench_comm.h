// `trainer bench comm`: what the Communicator and the CommLog cost on top of bare MPI, measured side
// by side in one run under mpiexec (docs/architecture.md section 8: benchmarks print ratios, never pass/fail).
//
// Cases, interleaved step by step so that drift in the machine hits them alike; each step is the
// sync of an n-float gradient (sum over ranks, then scale by 1/P, as dense sync must do):
//   (a) MPI_Allreduce(MPI_IN_PLACE) of the whole buffer, bare MPI
//   (b) the same through the Communicator, log disabled
//   (c) the same with the log enabled (records written to a temporary file)
//   (d) the dense GradientSync (comm/sync/methods/dense/dense.h) with the whole buffer as one bucket, log enabled:
//       the stage's own overhead on the same message as (a)
//   (e) the dense GradientSync with bucket_mb-MB buckets (the trainer's sync.bucket_mb), log enabled
// A step's time is the slowest rank's; the table shows the median over `steps` steps (after 2
// warmup steps) and each case's overhead relative to (a). Rank 0 prints the table and one JSON line.
#pragma once

#include <cstdint>

namespace trainer::comm {

// The LSTM (DeepSpeech) gradient of the Ok-Top-k paper's AN4 experiment.
constexpr int64_t kBenchCommDefaultN = 27569568;

// Collective over world(). Returns the process exit code (0; 2 for bad arguments).
int run_comm_bench(int64_t n = kBenchCommDefaultN, int steps = 20, double bucket_mb = 25.0);

}  // namespace trainer::comm
