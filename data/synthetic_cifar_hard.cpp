#include "data/synthetic_cifar_hard.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace trainer::data::synthetic {
namespace {

// The knobs the calibration moved (docs/running.md lists each probe and its accuracy); everything
// else below is a fixed range.
constexpr double kNoiseMin = 0.015, kNoiseMax = 0.035;    // pixel noise standard deviation, [0,1] scale
constexpr double kBlurMaxSigma = 0.25;                    // Gaussian blur, pixels (0 = sharp)
constexpr int kMaxDistractors = 2;                        // 0..this many, uniformly
constexpr double kDistractorScale = 0.45;                 // largest distractor radius / main radius
constexpr double kOcclusionChance = 0.1;                  // a bar in front of the main object
constexpr double kMinContrast = 0.5;                      // RGB distance between object and background
constexpr double kMainRadiusMin = 8.5, kMainRadiusMax = 12.0;

enum Label { kDisc, kSquare, kTriangle, kCross, kRing, kHStripes, kVStripes, kChecker, kDiagonal,
             kTwoBlobs };
enum Texture { kSolid, kStripesAlongV, kStripesAlongU, kCheckerCells, kDots };

bool is_pattern(int label) {
  return label == kHStripes || label == kVStripes || label == kChecker || label == kDiagonal;
}

// One object: an outline (a solid class's shape) filled with a texture, placed and deformed.
struct Object {
  int shape;                     // kDisc, kSquare, kTriangle, kCross, kRing or kTwoBlobs
  Texture texture;
  Colour fg, fg2;
  bool fg2_is_background;        // textures: the "off" parts show what lies behind
  double cx, cy, r, angle;       // centre, radius (pixels), rotation
  double stretch;                // aspect: u is scaled by 1/stretch, v by stretch
  double warp_amp, warp_freq, warp_phase;  // u += amp * sin(freq * v + phase), in radius units
  double corner;                 // square: corner radius (0 = sharp, towards a disc)
  double thickness;              // ring: half-width; cross: arm half-width (radius units)
  double blob_gap;               // two blobs: centre offset (small = merged into one oval)
  double period, phase, phase2, cell_stretch;  // textures (pixels)
  double shade_amp, shade_angle;
};

Colour random_colour(Rng& rng) { return hsv(rng.uniform(), rng.uniform(0.25, 1.0), rng.uniform(0.3, 1.0)); }

// An object of class `label` with radius in [r_min, r_max], coloured to stand out from `behind`.
Object draw_object(int label, double r_min, double r_max, const Colour& behind, Rng& rng) {
  Object o{};
  o.r = rng.uniform(r_min, r_max);
  o.cx = 16 + rng.uniform(-7.0, 7.0);
  o.cy = 16 + rng.uniform(-7.0, 7.0);
  o.fg = random_colour(rng);
  for (int tries = 0; tries < 8 && distance(o.fg, behind) < kMinContrast; ++tries) o.fg = random_colour(rng);
  if (distance(o.fg, behind) < kMinContrast) o.fg = {1 - behind[0], 1 - behind[1], 1 - behind[2]};
  int fg2_kind = static_cast<int>(rng.below(3));
  o.fg2_is_background = fg2_kind == 0;
  double k = rng.uniform(0.15, 0.5);
  for (int c = 0; c < 3; ++c) o.fg2[c] = fg2_kind == 1 ? o.fg[c] * k : o.fg[c] + (1 - o.fg[c]) * (1 - k);

  static constexpr int kPatchShapes[4] = {kDisc, kSquare, kTriangle, kTwoBlobs};
  double wobble = 0.25 * rng.normal();
  switch (label) {
    case kHStripes: o.texture = kStripesAlongV; o.angle = wobble; break;
    case kVStripes: o.texture = kStripesAlongU; o.angle = wobble; break;
    case kChecker: o.texture = kCheckerCells; o.angle = wobble; break;
    case kDiagonal: o.texture = kStripesAlongU; o.angle = (rng.chance(0.5) ? 0.25 : -0.25) * kPi + wobble; break;
    default: o.texture = rng.chance(0.25) ? kDots : kSolid; o.angle = rng.uniform(0.0, 2 * kPi); break;
  }
  o.shape = is_pattern(label) ? kPatchShapes[rng.below(4)] : label;
  o.stretch = std::exp(rng.uniform(-0.35, 0.35));
  o.warp_amp = rng.chance(0.5) ? rng.uniform(0.0, 0.15) : 0.0;
  o.warp_freq = rng.uniform(2.0, 5.0);
  o.warp_phase = rng.uniform(0.0, 2 * kPi);
  o.corner = rng.uniform(0.0, 0.4);
  o.thickness = label == kRing ? rng.uniform(0.12, 0.3) : rng.uniform(0.18, 0.4);
  o.blob_gap = rng.uniform(0.35, 0.65);
  o.period = rng.uniform(3.5, 6.0);
  o.phase = rng.uniform(0.0, 2 * kPi);
  o.phase2 = rng.uniform(0.0, 2 * kPi);
  o.cell_stretch = std::exp(rng.uniform(-0.3, 0.3));
  o.shade_amp = rng.uniform(0.0, 0.3);
  o.shade_angle = rng.uniform(0.0, 2 * kPi);
  return o;
}

// Signed distance (pixels, negative inside) of the outline at local coordinates (u, v), radius units.
double outline(const Object& o, double u, double v) {
  u = u / o.stretch + o.warp_amp * std::sin(o.warp_freq * v + o.warp_phase);
  v = v * o.stretch;
  double au = std::fabs(u), av = std::fabs(v), len = std::sqrt(u * u + v * v);
  double d;
  switch (o.shape) {
    case kDisc: d = len - 0.9; break;
    case kSquare: {  // a rounded square of half-side 0.72
      double qu = au - (0.72 - o.corner), qv = av - (0.72 - o.corner);
      double outside = std::sqrt(std::max(qu, 0.0) * std::max(qu, 0.0) + std::max(qv, 0.0) * std::max(qv, 0.0));
      d = outside + std::min(std::max(qu, qv), 0.0) - o.corner;
      break;
    }
    case kTriangle: {  // equilateral, circumradius 1
      d = -1e9;
      for (int e = 0; e < 3; ++e) {
        double a = -0.5 * kPi + e * 2.0 * kPi / 3.0;
        d = std::max(d, -(u * std::cos(a) + v * std::sin(a)) - 0.5);
      }
      break;
    }
    case kCross:
      d = std::min(std::max(au - 0.9, av - o.thickness), std::max(av - 0.9, au - o.thickness));
      break;
    case kRing: d = std::fabs(len - 0.68) - o.thickness; break;
    default: {  // two blobs
      double a = std::sqrt((u - o.blob_gap) * (u - o.blob_gap) + v * v);
      double b = std::sqrt((u + o.blob_gap) * (u + o.blob_gap) + v * v);
      d = std::min(a, b) - 0.42;
      break;
    }
  }
  return d * o.r;
}

// 1 where the object's own colour shows, 0 where its second colour does; U, V in pixels.
double texture(const Object& o, double U, double V) {
  double w = 2 * kPi / o.period, t;
  switch (o.texture) {
    case kStripesAlongV: t = std::sin(w * V + o.phase); break;
    case kStripesAlongU: t = std::sin(w * U + o.phase); break;
    case kCheckerCells: t = 2 * std::sin(0.5 * w * U + o.phase) * std::sin(0.5 * w * V / o.cell_stretch + o.phase2); break;
    case kDots: t = 2 * (std::cos(w * U + o.phase) * std::cos(w * V + o.phase2) - 0.45); break;
    default: return 1.0;
  }
  return clamp01(0.5 + 1.5 * t);
}

struct Scene {
  Colour bg;
  double grad_amp, grad_angle;
  int waves;
  double wave_k[3][2], wave_phase[3], wave_amp[3];
  int distractors;
  Object distractor[kMaxDistractors];
  Object main;
  bool occluded;
  double bar_cx, bar_cy, bar_angle, bar_half_len, bar_half_width;
  Colour bar_colour;
  double blur, noise;
};

Scene draw_scene(int label, Rng& rng) {
  Scene s{};
  s.bg = hsv(rng.uniform(), rng.uniform(0.0, 0.7), rng.uniform(0.1, 0.95));
  s.grad_amp = rng.uniform(0.0, 0.4);
  s.grad_angle = rng.uniform(0.0, 2 * kPi);
  s.waves = rng.chance(0.7) ? 3 : 0;
  for (int w = 0; w < 3; ++w) {
    double freq = rng.uniform(1.0 / 32, 1.0 / 8), a = rng.uniform(0.0, 2 * kPi);
    s.wave_k[w][0] = 2 * kPi * freq * std::cos(a);
    s.wave_k[w][1] = 2 * kPi * freq * std::sin(a);
    s.wave_phase[w] = rng.uniform(0.0, 2 * kPi);
    s.wave_amp[w] = rng.uniform(0.0, 0.12);
  }
  s.main = draw_object(label, kMainRadiusMin, kMainRadiusMax, s.bg, rng);
  s.distractors = static_cast<int>(rng.below(kMaxDistractors + 1));
  for (int i = 0; i < kMaxDistractors; ++i) {  // all drawn, so the draw count does not depend on s.distractors
    int other = static_cast<int>((label + 1 + rng.below(9)) % 10);
    s.distractor[i] = draw_object(other, 2.5, std::max(3.0, kDistractorScale * s.main.r), s.bg, rng);
    s.distractor[i].cx = rng.uniform(2.0, 30.0);
    s.distractor[i].cy = rng.uniform(2.0, 30.0);
  }
  s.occluded = rng.chance(kOcclusionChance);
  s.bar_cx = s.main.cx + rng.uniform(-0.8, 0.8) * s.main.r;
  s.bar_cy = s.main.cy + rng.uniform(-0.8, 0.8) * s.main.r;
  s.bar_angle = rng.uniform(0.0, kPi);
  s.bar_half_len = rng.uniform(4.0, 16.0);
  s.bar_half_width = rng.uniform(1.0, 0.25 * s.main.r);
  s.bar_colour = random_colour(rng);
  s.blur = rng.uniform(0.0, kBlurMaxSigma);
  s.noise = rng.uniform(kNoiseMin, kNoiseMax);
  return s;
}

using Image = std::array<std::array<double, kSide * kSide>, 3>;

// Paints o over img (soft edges, textures, shading).
void paint(const Object& o, Image& img) {
  double ca = std::cos(o.angle), sa = std::sin(o.angle);
  double hx = std::cos(o.shade_angle), hy = std::sin(o.shade_angle);
  int x0 = std::max(0, static_cast<int>(o.cx - 2 * o.r - 2)), x1 = std::min(kSide, static_cast<int>(o.cx + 2 * o.r + 3));
  int y0 = std::max(0, static_cast<int>(o.cy - 2 * o.r - 2)), y1 = std::min(kSide, static_cast<int>(o.cy + 2 * o.r + 3));
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      double px = x + 0.5, py = y + 0.5;
      double U = (px - o.cx) * ca + (py - o.cy) * sa;
      double V = -(px - o.cx) * sa + (py - o.cy) * ca;
      double m = coverage(outline(o, U / o.r, V / o.r));
      if (m <= 0) continue;
      double t = texture(o, U, V);
      double shade = o.texture == kSolid ? 1.0 + o.shade_amp * (U * hx + V * hy) / o.r : 1.0;
      for (int c = 0; c < 3; ++c) {
        double& p = img[c][y * kSide + x];
        double second = o.fg2_is_background ? p : o.fg2[c];
        double colour = t * o.fg[c] * shade + (1 - t) * second;
        p += m * (colour - p);
      }
    }
  }
}

// Separable Gaussian blur, edges clamped; a no-op below a tenth of a pixel.
void blur(double sigma, Image& img) {
  if (sigma < 0.1) return;
  constexpr int kTaps = 3;  // radius; sigma <= 1 keeps the truncated tail under 1%
  double w[kTaps + 1], sum = 0;
  for (int i = 0; i <= kTaps; ++i) sum += (i ? 2 : 1) * (w[i] = std::exp(-0.5 * i * i / (sigma * sigma)));
  for (double& v : w) v /= sum;
  std::array<double, kSide * kSide> tmp;
  for (auto& plane : img) {
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 along x, pass 1 along y
      for (int y = 0; y < kSide; ++y) {
        for (int x = 0; x < kSide; ++x) {
          double acc = 0;
          for (int i = -kTaps; i <= kTaps; ++i) {
            int xx = pass == 0 ? std::clamp(x + i, 0, kSide - 1) : x;
            int yy = pass == 1 ? std::clamp(y + i, 0, kSide - 1) : y;
            acc += w[std::abs(i)] * plane[yy * kSide + xx];
          }
          tmp[y * kSide + x] = acc;
        }
      }
      plane = tmp;
    }
  }
}

}  // namespace

void render_hard_image(int label, Rng& rng, uint8_t* out) {
  Scene s = draw_scene(label, rng);
  Image img;
  double gx = std::cos(s.grad_angle), gy = std::sin(s.grad_angle);
  PlaneWave waves[3];
  for (int w = 0; w < s.waves; ++w) waves[w] = PlaneWave(s.wave_k[w][0], s.wave_k[w][1], s.wave_phase[w]);
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      double lum = s.grad_amp * ((x + 0.5 - 16) * gx + (y + 0.5 - 16) * gy) / 22.0;
      for (int w = 0; w < s.waves; ++w) lum += s.wave_amp[w] * waves[w].at(x, y);
      for (int c = 0; c < 3; ++c) img[c][y * kSide + x] = s.bg[c] + lum;
    }
  }
  for (int i = 0; i < s.distractors; ++i) paint(s.distractor[i], img);
  paint(s.main, img);
  if (s.occluded) {
    double ca = std::cos(s.bar_angle), sa = std::sin(s.bar_angle);
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        double U = (x + 0.5 - s.bar_cx) * ca + (y + 0.5 - s.bar_cy) * sa;
        double V = -(x + 0.5 - s.bar_cx) * sa + (y + 0.5 - s.bar_cy) * ca;
        double m = coverage(std::max(std::fabs(U) - s.bar_half_len, std::fabs(V) - s.bar_half_width));
        for (int c = 0; c < 3; ++c) img[c][y * kSide + x] += m * (s.bar_colour[c] - img[c][y * kSide + x]);
      }
    }
  }
  blur(s.blur, img);
  for (int p = 0; p < kSide * kSide; ++p) {
    for (int c = 0; c < 3; ++c) {
      double v = img[c][p] + s.noise * rng.pixel_noise();
      out[c * kCifarPlaneBytes + p] = static_cast<uint8_t>(clamp01(v) * 255.0 + 0.5);
    }
  }
}

}  // namespace trainer::data::synthetic
