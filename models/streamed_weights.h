// What bounds a recurrent model's training step at small batches. A product that runs one time
// step at a time (an LSTM's recurrence, LAS's speller cells) multiplies only the batch's few rows by
// its weights, so it does about 2 * rows FLOPs per weight element read: at batch 8, 4 FLOPs per
// fp32 byte, far below what the cores compute per byte the memory (or the cache holding the weights)
// delivers. Its time is then the weights it reads divided by that bandwidth, and the step's lower
// bound is those reads plus the rest of its FLOPs at the GEMM peak (`trainer bench` prints it for
// the speech models; docs/benchmarks-journal.md, "The memory-traffic bound of the speech steps").
#pragma once

#include <cstdint>

namespace trainer::models {

struct StreamedWeights {
  int64_t working_set = 0;  // weight elements read again at every time step (one recurrence's)
  double reads = 0;         // weight elements read in a training step, forward and backward
  int64_t rows = 0;         // the rows each read multiplies: its FLOPs are 2 * rows * reads
};

}  // namespace trainer::models
