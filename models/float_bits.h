// A float's bit pattern and back (std::bit_cast before C++20): the number formats' conversions
// (models/bf16.h, models/low_bit_blocks.h, comm/wire_format.cpp) work on the IEEE bits. Host and
// device alike: nvcc compiles the memcpy into a register move, so the CUDA kernels call the same
// functions (TRAINER_HOST_DEVICE).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TRAINER_HOST_DEVICE __host__ __device__
#else
#define TRAINER_HOST_DEVICE
#endif

namespace trainer::models {

TRAINER_HOST_DEVICE inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TRAINER_HOST_DEVICE inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace trainer::models
