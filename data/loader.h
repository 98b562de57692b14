// The image input pipeline: sharded sampling, augmentation, normalization, background preparation.
//
// Sampling. Epoch e's global order is a permutation of [0, N) seeded by (seed, e) (identity without
// shuffle), the same on every rank. Global batch b is the world * batch_size consecutive samples
// starting at b * world * batch_size, and rank r takes the r-th contiguous slice of it. So P ranks
// with batch B together see exactly the samples one process with batch P * B sees, batch by batch,
// which is what makes data-parallel runs comparable to single-process runs.
//   drop_last = true:  batches_per_epoch = floor(N / (world * batch_size)); every batch is full.
//   drop_last = false: the last, partial global batch of g samples is kept and split as evenly as
//     contiguous slices allow (rank r takes [r*g/world, (r+1)*g/world)), so a rank's last batch may
//     be smaller than the others' or even empty (size 0). Every rank gets the same number of batches,
//     so collective operations in an evaluation loop stay matched; sum counts across ranks.
//
// Augmentation (training): a random 32x32 crop of the image zero-padded by 4 pixels (zero in raw
// pixel space, before normalization, as torchvision does) and a horizontal flip with probability 1/2.
// The randomness of sample i in epoch e comes from a generator seeded by (seed, e, i) only, so the
// output does not depend on thread count or timing, and a resumed run is bit-identical.
//
// Output is float NHWC (channels-last, the engine's activation layout), normalized
// ((x / 255 - mean) / std, computed in double and rounded to float) in the same pass that crops and
// flips.
//
// Background preparation: `threads` workers prepare batches ahead (a few at most) while the model
// computes; next() hands them out strictly in order. A worker's exception is rethrown by the next()
// that asks for its batch. threads = 0 prepares each batch inside next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/cifar.h"
#include "data/prefetch.h"

namespace trainer::data {

struct LoaderOptions {
  int64_t batch_size = 128;  // per rank
  // The global batch, when it is not world x batch_size: an elastic resume keeps the global batch
  // of a run on another number of ranks (trainer/checkpoint/reshard.h), and where the new world does not
  // divide it, rank r takes [r G / world, (r + 1) G / world) of every global batch of G, as it
  // takes its share of a partial last batch; batch_size is then ignored. 0: world x batch_size.
  int64_t global_batch = 0;
  bool shuffle = true;
  bool augment = false;
  bool drop_last = true;
  uint64_t seed = 0;
  int rank = 0;
  int world = 1;
  int threads = 2;  // background workers; 0 = prepare synchronously in next()
};

struct Normalization {
  float mean[3];  // per channel (R, G, B), pixels in [0, 1]
  float std[3];
};

// Per-channel mean and (population) standard deviation of the pixels scaled to [0, 1]. A constant
// channel gets std 1, so normalizing it cannot divide by zero.
Normalization channel_stats(const ImageSet& set);

struct Batch {
  std::vector<float> images;     // size x 32 x 32 x 3, NHWC, normalized
  std::vector<int32_t> labels;   // size
  std::vector<int64_t> indices;  // size: each sample's index in the ImageSet
  int64_t size = 0;              // samples on this rank (may be < batch_size only without drop_last)
  int64_t epoch = 0;
  int64_t index = 0;             // batch index within the epoch
};

class ImageLoader {
 public:
  // The set must outlive the loader. Throws std::invalid_argument for bad options or when the set
  // holds less than one global batch with drop_last.
  ImageLoader(const ImageSet& set, Normalization norm, LoaderOptions opts);
  ~ImageLoader();  // stops and joins the workers; at most the batches in progress finish first
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t global_batch() const { return global_; }
  // The next call to next() returns batch batch_index of epoch `epoch` (checkpoint resume).
  // batch_index may equal batches_per_epoch(), meaning the first batch of the next epoch, so a
  // checkpoint can store (last.epoch, last.index + 1).
  void seek(int64_t epoch, int64_t batch_index);
  // Blocks until the next batch is ready; after an epoch's last batch comes the next epoch's first.
  Batch next();

 private:
  // Batches are numbered across epochs: sequence s is batch s % batches_per_epoch of epoch
  // s / batches_per_epoch.
  Batch make_batch(int64_t sequence);
  std::shared_ptr<const std::vector<int32_t>> order(int64_t epoch);

  const ImageSet& set_;
  LoaderOptions opts_;
  float lut_[3][256];  // normalized value of each raw byte, per channel
  int64_t global_ = 0;  // samples per global batch
  int64_t batches_per_epoch_ = 0;

  // Epoch orders, shared by the workers (a few epochs at most are live at a time).
  std::mutex order_mutex_;
  std::map<int64_t, std::shared_ptr<const std::vector<int32_t>>> orders_;

  // Background preparation (data/prefetch.h); last, so its workers stop before the rest goes.
  std::unique_ptr<Prefetcher<Batch>> prefetch_;
};

}  // namespace trainer::data
