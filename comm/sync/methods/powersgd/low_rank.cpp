#include "comm/sync/methods/powersgd/low_rank.h"

namespace trainer::comm {

void seeded_uniform(uint64_t seed, uint64_t stream, int64_t count, float* out) {
  const uint64_t base = seed * 0x9E3779B97F4A7C15ull + (stream << 32);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t z = base + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = static_cast<float>(static_cast<double>(z >> 40) * 0x1p-23 - 1.0);
  }
}

}  // namespace trainer::comm
