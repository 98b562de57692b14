// The ceilings `trainer bench` measures on this machine, and the training step's lower bound made
// from them: the GEMM peak (oneDNN's sgemm, or its bf16 matmul), the rate at which the threads read
// a working set of a given size over and over (the bandwidth of whichever cache or memory holds it),
// and for the speech models the memory-traffic bound of models/streamed_weights.h.
#pragma once

#include <cstdint>
#include <vector>

#include "models/streamed_weights.h"

namespace trainer::app {

// FLOP/s (in G) of a 1024^3 product, best of 5 after a warm-up: oneDNN's sgemm (the practical
// ceiling of the fp32 convolution and LSTM kernels), or under bf16 the layers' bf16 matmul
// (models/cpu/dnnl_matmul.h, its operand copies included).
double gemm_gflops(bool bf16);

// GB/s at which the OpenMP threads read a buffer of `bytes` again and again (best of 5 rounds of at
// least 256 MB read, each round one parallel region; each thread reads its own static share, as a
// GEMM's threads split a weight matrix).
double read_gbps(int64_t bytes);

struct StepBound {
  double ms = 0;             // the bound: streamed_ms + rest_ms
  double streamed_ms = 0;    // the streamed weights at the bandwidth of their working sets
  double streamed_bytes = 0;
  double streamed_gflop = 0;  // the FLOPs of those products (done while the weights stream)
  double read_gbps = 0;       // streamed_bytes / streamed_ms
  double rest_gflop = 0, rest_ms = 0;  // every other FLOP of the step, at the GEMM peak
};

// The bound of a step of `step_gflop` GFLOP, of which the products of `streamed` read their weights
// as elements of `element_bytes` bytes (4 fp32, 2 bf16), with the rest at `peak_gflops`.
StepBound step_bound(const std::vector<models::StreamedWeights>& streamed, int element_bytes, double step_gflop,
                     double peak_gflops);

}  // namespace trainer::app
