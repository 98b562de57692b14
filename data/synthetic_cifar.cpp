#include "data/synthetic_cifar.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "data/cifar.h"
#include "data/synthetic_canvas.h"
#include "data/synthetic_cifar_hard.h"

namespace trainer::data {
namespace fs = std::filesystem;

const char* const kSyntheticCifarClasses[10] = {
    "disc", "square", "triangle", "cross", "ring",
    "horizontal_stripes", "vertical_stripes", "checker", "diagonal_stripes", "two_blobs"};

namespace {

using namespace synthetic;

// README.txt's first words mark a folder as ours; its variant line says which generator wrote it.
constexpr const char* kReadmeFirstWords = "Synthetic CIFAR-10 stand-in";
constexpr const char* kVariantPrefix = "variant = ";

enum Label { kDisc, kSquare, kTriangle, kCross, kRing, kHStripes, kVStripes, kChecker, kDiagonal,
             kTwoBlobs };

// Everything random about one image, drawn before any pixel so that the draw order is fixed.
struct Scene {
  int label;
  Colour bg, fg, fg2;
  bool fg2_is_background;       // pattern classes: the "off" stripes show the background
  double grad_amp, grad_angle;  // background luminance gradient
  int waves;                    // background blotches: sum of low-frequency waves
  double wave_k[3][2], wave_phase[3], wave_amp[3];
  double cx, cy, r, angle;      // the object: centre, radius (pixels), rotation
  bool square_patch;            // pattern classes: patch outline
  double period, phase;         // pattern classes: stripe period / checker cell (pixels)
  double shade_amp, shade_angle;  // solid classes: a gentle shading across the object
  bool distractor;              // half of the images: a small blob of any colour, behind the object
  double dx, dy, dr;
  Colour dcol;
  double noise;                 // additive Gaussian pixel noise (standard deviation, [0,1] scale)
};

Scene draw_scene(int label, Rng& rng) {
  Scene s{};
  s.label = label;
  // Colour is a hint, never the answer: 30% of the objects take any hue, the rest sit near their
  // class hue with a jitter that overlaps the neighbouring classes.
  double hue = rng.chance(0.3) ? rng.uniform() : label / 10.0 + 0.05 * rng.normal();
  s.fg = hsv(hue, rng.uniform(0.45, 1.0), rng.uniform(0.45, 1.0));
  s.bg = hsv(rng.uniform(), rng.uniform(0.0, 0.6), rng.uniform(0.1, 0.95));
  // The object must be visible; redraw the background a few times, then fall back to the
  // complement of the object's colour.
  for (int tries = 0; tries < 8 && distance(s.fg, s.bg) < 0.4; ++tries) {
    s.bg = hsv(rng.uniform(), rng.uniform(0.0, 0.6), rng.uniform(0.1, 0.95));
  }
  if (distance(s.fg, s.bg) < 0.4) s.bg = {1 - s.fg[0], 1 - s.fg[1], 1 - s.fg[2]};
  int fg2_kind = static_cast<int>(rng.below(3));
  s.fg2_is_background = fg2_kind == 0;
  double k = rng.uniform(0.15, 0.45);
  for (int c = 0; c < 3; ++c) s.fg2[c] = fg2_kind == 1 ? s.fg[c] * k : s.fg[c] + (1 - s.fg[c]) * (1 - k);

  s.grad_amp = rng.uniform(0.0, 0.3);
  s.grad_angle = rng.uniform(0.0, 2 * kPi);
  s.waves = rng.chance(0.5) ? 3 : 0;
  for (int w = 0; w < 3; ++w) {
    double freq = rng.uniform(1.0 / 32, 1.0 / 12), a = rng.uniform(0.0, 2 * kPi);
    s.wave_k[w][0] = 2 * kPi * freq * std::cos(a);
    s.wave_k[w][1] = 2 * kPi * freq * std::sin(a);
    s.wave_phase[w] = rng.uniform(0.0, 2 * kPi);
    s.wave_amp[w] = rng.uniform(0.0, 0.08);
  }

  bool pattern = label == kHStripes || label == kVStripes || label == kChecker || label == kDiagonal;
  s.cx = 16 + rng.uniform(-6.0, 6.0);
  s.cy = 16 + rng.uniform(-6.0, 6.0);
  s.r = pattern ? rng.uniform(7.5, 11.0) : rng.uniform(7.0, 11.0);
  // Solid shapes take any rotation; pattern classes are defined by their orientation, so they only
  // wobble (diagonal stripes lean either way, which also makes them closed under a flip).
  double wobble = 0.15 * rng.normal();
  switch (label) {
    case kHStripes: case kVStripes: case kChecker: s.angle = wobble; break;
    case kDiagonal: s.angle = (rng.chance(0.5) ? 0.25 : -0.25) * kPi + wobble; break;
    default: s.angle = rng.uniform(0.0, 2 * kPi); break;
  }
  s.square_patch = rng.chance(0.5);
  s.period = label == kChecker ? rng.uniform(3.0, 5.0) : rng.uniform(3.5, 6.0);
  s.phase = rng.uniform(0.0, 2 * kPi);
  s.shade_amp = rng.uniform(0.0, 0.25);
  s.shade_angle = rng.uniform(0.0, 2 * kPi);

  s.distractor = rng.chance(0.5);
  s.dx = rng.uniform(3.0, 29.0);
  s.dy = rng.uniform(3.0, 29.0);
  s.dr = rng.uniform(1.5, 2.2);
  s.dcol = hsv(rng.uniform(), rng.uniform(0.0, 1.0), rng.uniform(0.2, 1.0));
  s.noise = rng.uniform(0.02, 0.05);
  return s;
}

// Signed distance (pixels, negative inside) of the object's outline at local coordinates (u, v),
// which are in units of the object radius.
double outline(const Scene& s, double u, double v) {
  double au = std::fabs(u), av = std::fabs(v), len = std::sqrt(u * u + v * v);
  double d;
  switch (s.label) {
    case kDisc: d = len - 0.9; break;
    case kSquare: d = std::max(au, av) - 0.72; break;
    case kTriangle: {  // equilateral, circumradius 1: the farthest of three edge half-planes
      d = -1e9;
      for (int e = 0; e < 3; ++e) {
        double a = -0.5 * kPi + e * 2.0 * kPi / 3.0;
        d = std::max(d, -(u * std::cos(a) + v * std::sin(a)) - 0.5);
      }
      break;
    }
    case kCross:
      d = std::min(std::max(au - 0.9, av - 0.28), std::max(av - 0.9, au - 0.28));
      break;
    case kRing: d = std::fabs(len - 0.7) - 0.2; break;
    case kTwoBlobs: {
      double a = std::sqrt((u - 0.55) * (u - 0.55) + v * v), b = std::sqrt((u + 0.55) * (u + 0.55) + v * v);
      d = std::min(a, b) - 0.42;
      break;
    }
    default: d = s.square_patch ? std::max(au, av) - 0.8 : len - 0.95; break;  // pattern patch
  }
  return d * s.r;
}

// Pattern classes: 1 where the object's own colour shows, 0 where the second colour does, with a soft
// transition. su, sv are the pattern's waves along the object's two axes.
double pattern(int label, double su, double sv) {
  double t;
  switch (label) {
    case kHStripes: t = sv; break;
    case kVStripes: case kDiagonal: t = su; break;
    case kChecker: t = 2 * su * sv; break;
    default: return 1.0;
  }
  return clamp01(0.5 + 1.5 * t);
}

void render(const Scene& s, Rng& rng, uint8_t* out) {
  double ca = std::cos(s.angle), sa = std::sin(s.angle);
  double gx = std::cos(s.grad_angle), gy = std::sin(s.grad_angle);
  double hx = std::cos(s.shade_angle), hy = std::sin(s.shade_angle);
  PlaneWave waves[3];
  for (int w = 0; w < s.waves; ++w) waves[w] = PlaneWave(s.wave_k[w][0], s.wave_k[w][1], s.wave_phase[w]);
  // sin(f * U + phase) and sin(f * V + phase) in image coordinates; a checker cell is one period of
  // stripes wide, so its waves run at half the frequency.
  double f = (s.label == kChecker ? 0.5 : 1.0) * 2 * kPi / s.period;
  PlaneWave along_u(f * ca, f * sa, s.phase - f * (s.cx * ca + s.cy * sa));
  PlaneWave along_v(-f * sa, f * ca, s.phase + f * (s.cx * sa - s.cy * ca));
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      double px = x + 0.5, py = y + 0.5;
      double lum = s.grad_amp * ((px - 16) * gx + (py - 16) * gy) / 22.0;
      for (int w = 0; w < s.waves; ++w) lum += s.wave_amp[w] * waves[w].at(x, y);
      Colour back;
      for (int c = 0; c < 3; ++c) back[c] = s.bg[c] + lum;
      if (s.distractor) {
        double m = coverage(std::sqrt((px - s.dx) * (px - s.dx) + (py - s.dy) * (py - s.dy)) - s.dr);
        for (int c = 0; c < 3; ++c) back[c] += m * (s.dcol[c] - back[c]);
      }
      double U = (px - s.cx) * ca + (py - s.cy) * sa;
      double V = -(px - s.cx) * sa + (py - s.cy) * ca;
      double m = coverage(outline(s, U / s.r, V / s.r));
      double t = pattern(s.label, along_u.at(x, y), along_v.at(x, y));
      double shade = 1.0 + s.shade_amp * (U * hx + V * hy) / s.r;
      for (int c = 0; c < 3; ++c) {
        double second = s.fg2_is_background ? back[c] : s.fg2[c];
        double object = t * s.fg[c] * shade + (1 - t) * second;
        double v = back[c] + m * (object - back[c]) + s.noise * rng.pixel_noise();
        out[c * kCifarPlaneBytes + y * kSide + x] = static_cast<uint8_t>(clamp01(v) * 255.0 + 0.5);
      }
    }
  }
}

// Labels of one split: each class equally often (counts differ by at most one), in a seeded order.
std::vector<uint8_t> balanced_labels(int64_t n, uint64_t seed, uint64_t split) {
  std::vector<uint8_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % kCifarClasses);
  Rng rng(stream_seed(seed, split, ~0ull));
  for (int64_t i = n - 1; i > 0; --i) std::swap(labels[i], labels[rng.below(i + 1)]);
  return labels;
}

// Writes bytes to path through a temporary name in the same folder, then renames: readers see either
// no file or the whole file. The pid in the temporary name lets several processes (e.g. every rank)
// generate into one folder at once; they write identical bytes.
void write_atomically(const fs::path& path, const void* data, size_t bytes) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(tmp.string() + ": cannot create (" + std::strerror(errno) + ")");
  bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(::fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    fs::remove(tmp);
    throw std::runtime_error(tmp.string() + ": write failed (" + std::strerror(errno) + ")");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw std::runtime_error(path.string() + ": cannot rename into place (" + ec.message() + ")");
  }
}

// Renders records [first, first + count) of a split into one file's bytes.
std::vector<uint8_t> render_records(const std::vector<uint8_t>& labels, int64_t first, int64_t count,
                                    uint64_t seed, uint64_t split, SyntheticVariant variant) {
  std::vector<uint8_t> bytes(count * kCifarRecordBytes);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    int64_t index = first + i;
    uint8_t* rec = bytes.data() + i * kCifarRecordBytes;
    rec[0] = labels[index];
    Rng rng(stream_seed(seed, split, static_cast<uint64_t>(index)));
    if (variant == SyntheticVariant::kHard) {
      render_hard_image(labels[index], rng, rec + 1);
    } else {
      Scene scene = draw_scene(labels[index], rng);
      render(scene, rng, rec + 1);
    }
  }
  return bytes;
}

}  // namespace

const char* synthetic_variant_name(SyntheticVariant variant) {
  return variant == SyntheticVariant::kHard ? "hard" : "easy";
}

std::optional<SyntheticVariant> parse_synthetic_variant(const std::string& name) {
  if (name == "easy") return SyntheticVariant::kEasy;
  if (name == "hard") return SyntheticVariant::kHard;
  return std::nullopt;
}

std::optional<SyntheticVariant> synthetic_variant_in(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "README.txt");
  std::string line;
  if (!std::getline(in, line) || line.rfind(kReadmeFirstWords, 0) != 0) return std::nullopt;
  while (std::getline(in, line)) {
    if (line.rfind(kVariantPrefix, 0) == 0) return parse_synthetic_variant(line.substr(std::strlen(kVariantPrefix)));
  }
  return SyntheticVariant::kEasy;
}

void write_synthetic_cifar10(const std::string& dir, int64_t n_train, int64_t n_test, uint64_t seed,
                             SyntheticVariant variant) {
  if (n_train < kCifarTrainFiles || n_test < 1) {
    throw std::invalid_argument("synthetic cifar10: need at least 5 training images (one per file) "
                                "and 1 test image, got n_train = " + std::to_string(n_train) +
                                ", n_test = " + std::to_string(n_test));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create folder (" + ec.message() + ")");

  constexpr uint64_t kTrainSplit = 1, kTestSplit = 2;
  std::vector<std::string> train_paths = cifar10_files(dir, true);
  std::vector<uint8_t> train_labels = balanced_labels(n_train, seed, kTrainSplit);
  int64_t first = 0;
  for (int f = 0; f < kCifarTrainFiles; ++f) {
    int64_t count = n_train / kCifarTrainFiles + (f < n_train % kCifarTrainFiles ? 1 : 0);
    std::vector<uint8_t> bytes = render_records(train_labels, first, count, seed, kTrainSplit, variant);
    write_atomically(train_paths[f], bytes.data(), bytes.size());
    first += count;
  }
  std::vector<uint8_t> test_labels = balanced_labels(n_test, seed, kTestSplit);
  std::vector<uint8_t> bytes = render_records(test_labels, 0, n_test, seed, kTestSplit, variant);
  write_atomically(cifar10_files(dir, false)[0], bytes.data(), bytes.size());

  std::string readme =
      std::string(kReadmeFirstWords) + " (NOT the real CIFAR-10), written by trainer's data/synthetic_cifar.cpp.\n" +
      kVariantPrefix + synthetic_variant_name(variant) + "\n"
      "Format: exactly CIFAR-10 binary (3073-byte records: label, 1024 R, 1024 G, 1024 B).\n"
      "seed = " + std::to_string(seed) + ", train images = " + std::to_string(n_train) +
      " (data_batch_1..5.bin), test images = " + std::to_string(n_test) + " (test_batch.bin).\n"
      "Classes (label: name):";
  for (int c = 0; c < kCifarClasses; ++c) {
    readme += std::string(c ? "," : "") + " " + std::to_string(c) + ": " + kSyntheticCifarClasses[c];
  }
  readme += variant == SyntheticVariant::kHard
                ? ".\nEach image: the class shape or texture (pattern classes as patches of any outline) with a random\n"
                  "colour, scale, aspect, warp and rotation, among up to two smaller objects of other classes,\n"
                  "sometimes behind a bar, over a random background, blurred, with strong pixel noise.\n"
                : ".\nEach image: a class shape or texture with a jittered (often random) colour at random position,\n"
                  "size and rotation, over a random background with a distractor blob and pixel noise.\n";
  readme += "The same seed, counts and variant always give the same bytes.\n";
  write_atomically(fs::path(dir) / "README.txt", readme.data(), readme.size());
}

}  // namespace trainer::data
