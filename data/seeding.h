// The loaders' random numbers, defined here once so they are the same bytes on every machine and
// standard library (a resumed run must draw exactly what the interrupted one would have): every
// stream is seeded from (seed, stream tag, a, b) by splitmix64 mixing, and integers come by
// rejection, since std::uniform_int_distribution's algorithm differs between libraries.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace trainer::data {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A seed that depends on all four words (and their order): independent streams per epoch/sample.
inline uint64_t mix(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  uint64_t s = seed;
  s = splitmix64(s) ^ stream;
  s = splitmix64(s) ^ a;
  s = splitmix64(s) ^ b;
  return splitmix64(s);
}

// Uniform integer in [0, n) by rejection.
inline uint64_t below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = ~0ull - (~0ull % n);
  uint64_t x;
  do x = rng(); while (x >= limit);
  return x % n;
}

// Fisher-Yates with below(): the same permutation for the same seed everywhere.
template <typename T>
void shuffle(std::vector<T>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) std::swap(v[i], v[below(rng, i + 1)]);
}

}  // namespace trainer::data
