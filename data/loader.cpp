#include "data/loader.h"
#include "data/seeding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace trainer::data {

namespace {

constexpr int kPad = 4;  // random-crop padding on each side, in pixels
constexpr uint64_t kOrderStream = 0x6f72646572ull;    // "order": the epoch permutation
constexpr uint64_t kAugmentStream = 0x61756776ull;    // "augv": per-sample crop and flip

struct Augmentation {
  int ox = kPad, oy = kPad;  // crop origin in the padded image; (kPad, kPad) is the identity
  bool flip = false;
};

Augmentation draw_augmentation(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t s = mix(seed, kAugmentStream, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
  uint64_t r = splitmix64(s);
  Augmentation a;
  a.ox = static_cast<int>(((r & 0xFFFFFFFFull) * (2 * kPad + 1)) >> 32);
  a.oy = static_cast<int>(((r >> 32) * (2 * kPad + 1)) >> 32);
  a.flip = (splitmix64(s) & 1) != 0;
  return a;
}

// Writes one planar uint8 image as normalized NHWC floats, cropped and flipped on the way. Output
// pixel (y, x) shows padded pixel (y + oy, x' + ox) with x' = flip ? 31 - x : x (crop, then flip, as
// torchvision's RandomCrop + RandomHorizontalFlip); padding reads raw 0.
void write_image(const uint8_t* src, const float (*lut)[256], const Augmentation& a, float* dst) {
  constexpr int S = kCifarSide;
  for (int y = 0; y < S; ++y) {
    int sy = y + a.oy - kPad;
    bool row_inside = sy >= 0 && sy < S;
    for (int x = 0; x < S; ++x) {
      int sx = (a.flip ? S - 1 - x : x) + a.ox - kPad;
      bool inside = row_inside && sx >= 0 && sx < S;
      float* out = dst + (y * S + x) * kCifarChannels;
      for (int c = 0; c < kCifarChannels; ++c) {
        out[c] = lut[c][inside ? src[c * kCifarPlaneBytes + sy * S + sx] : 0];
      }
    }
  }
}

}  // namespace

Normalization channel_stats(const ImageSet& set) {
  // A histogram per channel keeps the sums exact and the pass cheap (one increment per byte).
  std::vector<int64_t> hist(kCifarChannels * 256, 0);
  for (int64_t i = 0; i < set.size(); ++i) {
    const uint8_t* img = set.image(i);
    for (int c = 0; c < kCifarChannels; ++c) {
      int64_t* h = hist.data() + c * 256;
      for (int p = 0; p < kCifarPlaneBytes; ++p) ++h[img[c * kCifarPlaneBytes + p]];
    }
  }
  Normalization norm{};
  for (int c = 0; c < kCifarChannels; ++c) {
    double count = 0, sum = 0, sum_sq = 0;
    for (int v = 0; v < 256; ++v) {
      double h = static_cast<double>(hist[c * 256 + v]), x = v / 255.0;
      count += h;
      sum += h * x;
      sum_sq += h * x * x;
    }
    double mean = count > 0 ? sum / count : 0.0;
    double var = count > 0 ? std::max(0.0, sum_sq / count - mean * mean) : 0.0;
    norm.mean[c] = static_cast<float>(mean);
    norm.std[c] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
  return norm;
}

ImageLoader::ImageLoader(const ImageSet& set, Normalization norm, LoaderOptions opts)
    : set_(set), opts_(opts) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("data loader: " + what); };
  if (opts_.batch_size < 1) bad("batch_size must be >= 1, got " + std::to_string(opts_.batch_size));
  if (opts_.world < 1) bad("world must be >= 1, got " + std::to_string(opts_.world));
  if (opts_.rank < 0 || opts_.rank >= opts_.world) {
    bad("rank " + std::to_string(opts_.rank) + " is outside [0, world = " + std::to_string(opts_.world) +
        ")");
  }
  if (opts_.threads < 0) bad("threads must be >= 0, got " + std::to_string(opts_.threads));
  if (set_.size() == 0) bad("the image set is empty");
  if (set_.size() > INT32_MAX) bad("more than 2^31 - 1 images are not supported");  // int32 orders
  for (int c = 0; c < kCifarChannels; ++c) {
    if (!(norm.std[c] > 0)) bad("normalization std of channel " + std::to_string(c) + " must be > 0");
  }
  if (opts_.global_batch < 0 || (opts_.global_batch > 0 && opts_.global_batch < opts_.world))
    bad("global_batch " + std::to_string(opts_.global_batch) + " leaves a rank of " + std::to_string(opts_.world) +
        " without samples");
  const int64_t global = global_ = opts_.global_batch > 0 ? opts_.global_batch : opts_.batch_size * opts_.world;
  batches_per_epoch_ = opts_.drop_last ? set_.size() / global : (set_.size() + global - 1) / global;
  if (batches_per_epoch_ == 0) {
    bad(std::to_string(set_.size()) + " images are fewer than one global batch (" + std::to_string(global) +
        ": world " + std::to_string(opts_.world) + " x batch_size " + std::to_string(opts_.batch_size) +
        ") with drop_last");
  }
  // Normalization as a table: the per-pixel work is one lookup, and every path (padding included)
  // produces exactly the same float for the same byte.
  for (int c = 0; c < kCifarChannels; ++c) {
    for (int v = 0; v < 256; ++v) lut_[c][v] = static_cast<float>((v / 255.0 - norm.mean[c]) / norm.std[c]);
  }
  prefetch_ = std::make_unique<Prefetcher<Batch>>(opts_.threads, [this](int64_t s) { return make_batch(s); });
}

ImageLoader::~ImageLoader() = default;

std::shared_ptr<const std::vector<int32_t>> ImageLoader::order(int64_t epoch) {
  std::lock_guard<std::mutex> lock(order_mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto perm = std::make_shared<std::vector<int32_t>>(set_.size());
  for (int64_t i = 0; i < set_.size(); ++i) (*perm)[i] = static_cast<int32_t>(i);
  if (opts_.shuffle) shuffle(*perm, mix(opts_.seed, kOrderStream, static_cast<uint64_t>(epoch), 0));
  // Workers near an epoch boundary need two orders at once; a few more cover tiny epochs. An
  // evicted order that is still in use lives on in its shared_ptr.
  if (orders_.size() >= 4) orders_.erase(orders_.begin());
  orders_.emplace(epoch, perm);
  return perm;
}

Batch ImageLoader::make_batch(int64_t sequence) {
  Batch batch;
  batch.epoch = sequence / batches_per_epoch_;
  batch.index = sequence % batches_per_epoch_;
  const int64_t n = set_.size(), world = opts_.world, rank = opts_.rank;
  const int64_t start = batch.index * global_;
  const int64_t g = std::min(global_, n - start);  // this global batch's samples
  const int64_t lo = start + rank * g / world, hi = start + (rank + 1) * g / world;
  batch.size = hi - lo;
  batch.images.resize(batch.size * kCifarImageBytes);
  batch.labels.resize(batch.size);
  batch.indices.resize(batch.size);

  std::shared_ptr<const std::vector<int32_t>> perm = order(batch.epoch);
  for (int64_t j = 0; j < batch.size; ++j) {
    int64_t index = (*perm)[lo + j];
    Augmentation a = opts_.augment ? draw_augmentation(opts_.seed, batch.epoch, index) : Augmentation{};
    write_image(set_.image(index), lut_, a, batch.images.data() + j * kCifarImageBytes);
    batch.labels[j] = set_.labels[index];
    batch.indices[j] = index;
  }
  return batch;
}

void ImageLoader::seek(int64_t epoch, int64_t batch_index) {
  if (epoch < 0 || batch_index < 0 || batch_index > batches_per_epoch_) {
    throw std::invalid_argument("data loader: cannot seek to epoch " + std::to_string(epoch) + " batch " +
                                std::to_string(batch_index) + " (batches per epoch: " +
                                std::to_string(batches_per_epoch_) + ")");
  }
  prefetch_->restart(epoch * batches_per_epoch_ + batch_index);
}

Batch ImageLoader::next() { return prefetch_->next(); }

}  // namespace trainer::data
