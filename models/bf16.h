// bf16 as our own loops read and write it: the top 16 bits of a float. Used by the CPU backend's
// bf16 activations (tensor.h's DType) and the 16-bit wire formats of the gradient sync
// (comm/wire_format.cpp). Widening is exact. Narrowing rounds to nearest even, as oneDNN's reorders
// do, so a value rounded here or by a oneDNN primitive is the same bf16: dropping the low 16 bits
// after adding 0x7fff plus the lowest kept bit; a carry out of the significand moves into the
// exponent, which is right (up to Inf from the largest finite values). A NaN is kept apart, because
// that add could carry its payload into Inf's pattern, and quieted (bit 6 of the result). Branch
// free, so that array loops vectorize. The CUDA backend's kernels call the same functions
// (models/cuda/bf16.cu), so the GPU rounds as the CPU does.
#pragma once

#include <cstdint>

#include "models/float_bits.h"

namespace trainer::models {

TRAINER_HOST_DEVICE inline uint16_t round_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (b >> 16) | 0x40u;
  return static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

TRAINER_HOST_DEVICE inline float widen_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

}  // namespace trainer::models
