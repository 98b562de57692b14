// The CPU backend's codec of the low-bit outer allreduce (Backend::quantize_blocks,
// sum_quantized_blocks, dequantize_blocks; models/low_bit_blocks.h): OpenMP loops over blocks,
// each inner loop one straight conversion the compiler vectorizes. They are the definition the CUDA
// kernels (models/cuda/low_bit.cu) match byte for byte, and what the host overload of
// comm::allreduce_sum_quantized runs.
#pragma once

#include <cstdint>

#include "models/low_bit_blocks.h"

namespace trainer::models::cpu {

void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks, uint8_t* chunk);
void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks, int64_t blocks,
                          float* acc);
void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count, float* out);

}  // namespace trainer::models::cpu
