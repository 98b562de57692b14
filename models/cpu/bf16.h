// bf16 as the CPU backend's own loops read and write it (activations under runtime.precision =
// bf16, models/tensor.h's DType): the top 16 bits of a float. Widening is exact; narrowing rounds
// to nearest even and keeps NaN a (quiet) NaN, as oneDNN's reorders do, so a value rounded here or
// by a oneDNN primitive is the same bf16.
#pragma once

#include <cstdint>
#include <cstring>

namespace trainer::models::cpu {

inline float widen_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

inline uint16_t round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace trainer::models::cpu
