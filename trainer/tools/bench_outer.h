// `trainer bench outer`: the low-bit allreduce of outer gradients (comm/quantized_allreduce.h) in
// every format on one synthetic buffer, under mpiexec: time per call (the slowest rank's, median
// over steps, the formats interleaved step by step so that drift hits them alike), time per MB of
// fp32 input, the part of it spent in the communicator's calls (from the comm log) and the rest,
// which is the conversions and the fp32 sum on this rank, and the bytes each rank sent. Prints a
// table and one JSON line (rank 0); a benchmark, never pass/fail (docs/architecture.md section 8).
#pragma once

#include <cstdint>

namespace trainer::comm {

// Collective over world(). Returns the process exit code (0; 2 for bad arguments).
int run_outer_bench(int64_t n, int steps);

}  // namespace trainer::comm
