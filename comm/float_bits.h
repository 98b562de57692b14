// A float's bit pattern and back (std::bit_cast before C++20): the number formats' conversions
// (wire_format.cpp, quantized_allreduce.cpp) work on the IEEE bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace trainer::comm {

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace trainer::comm
