// Drawing primitives shared by the synthetic CIFAR generators (data/synthetic_cifar.cpp, the easy
// variant, and data/synthetic_cifar_hard.cpp): a seeded random stream per image whose transforms are
// our own, colours, plane waves and soft-edged coverage. Internal to data/; the generators' public
// interface is data/synthetic_cifar.h.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <random>

#include "data/cifar.h"

namespace trainer::data::synthetic {

constexpr double kPi = 3.14159265358979323846;
constexpr int kSide = kCifarSide;

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One independent stream per (seed, split, index): images can be drawn in any order, on any thread.
inline uint64_t stream_seed(uint64_t seed, uint64_t split, uint64_t index) {
  uint64_t s = seed;
  s = splitmix64(s) ^ split;
  s = splitmix64(s) ^ index;
  return splitmix64(s);
}

// mt19937_64's output sequence is fixed by the C++ standard; the distributions are not, so the
// transforms below are ours.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  bool chance(double p) { return uniform() < p; }
  // Box-Muller; the second value is dropped so every call consumes exactly two draws.
  double normal() {
    double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
  // Cheap approximate normal for pixel noise (3,072 per image): the sum of four 16-bit uniforms from
  // one draw, scaled to unit variance (Irwin-Hall; tails stop at 3.5 sigma, which noise does not miss).
  double pixel_noise() {
    uint64_t x = engine_();
    double sum = static_cast<double>((x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48));
    return (sum * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
  }
  // Uniform integer in [0, n), by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    uint64_t limit = ~0ull - (~0ull % n);
    uint64_t x;
    do x = engine_(); while (x >= limit);
    return x % n;
  }

 private:
  std::mt19937_64 engine_;
};

using Colour = std::array<double, 3>;

inline Colour hsv(double h, double s, double v) {
  h = (h - std::floor(h)) * 6.0;
  int sector = static_cast<int>(h) % 6;
  double f = h - std::floor(h);
  double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  switch (sector) {
    case 0: return {v, t, p};
    case 1: return {q, v, p};
    case 2: return {p, v, t};
    case 3: return {p, q, v};
    case 4: return {t, p, v};
    default: return {v, p, q};
  }
}

inline double distance(const Colour& a, const Colour& b) {
  return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) +
                   (a[2] - b[2]) * (a[2] - b[2]));
}

// sin(kx * px + ky * py + phase) at every pixel centre, without a sin per pixel: angle addition over
// per-column and per-row tables (the backgrounds and all stripe patterns are plane waves).
class PlaneWave {
 public:
  PlaneWave() = default;
  PlaneWave(double kx, double ky, double phase) {
    for (int i = 0; i < kSide; ++i) {
      sx_[i] = std::sin(kx * (i + 0.5));
      cx_[i] = std::cos(kx * (i + 0.5));
      sy_[i] = std::sin(ky * (i + 0.5) + phase);
      cy_[i] = std::cos(ky * (i + 0.5) + phase);
    }
  }
  double at(int x, int y) const { return sx_[x] * cy_[y] + cx_[x] * sy_[y]; }

 private:
  double sx_[kSide] = {}, cx_[kSide] = {}, sy_[kSide] = {}, cy_[kSide] = {};
};

inline double clamp01(double x) { return x < 0 ? 0 : (x > 1 ? 1 : x); }

// Coverage of a pixel by a shape whose signed distance (in pixels, negative inside) is d: a one-pixel
// soft edge, so small shapes keep their outline instead of aliasing into blocks.
inline double coverage(double d) { return clamp01(0.5 - d); }

}  // namespace trainer::data::synthetic
