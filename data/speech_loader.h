// The speech input pipeline: length-bucketed, sharded batches of padded features with their true
// lengths and CTC labels, optional gain and speed augmentation, background preparation. It follows
// the image loader's conventions (loader.h): one global order per epoch shared by all ranks, rank r
// takes the r-th contiguous slice of each global batch of world * batch_size utterances, seek(epoch,
// batch) for exact resume, and output independent of thread count and timing.
//
// Bucketing (sort_by_length, the default). Utterances are sorted by (frames, index) and cut into
// global batches of G = world * batch_size consecutive utterances, so each global batch, and each
// rank's slice of it, holds similar lengths and padding stays small. With shuffle, the order of the
// global batches is a permutation seeded by (seed, epoch); without, shortest first.
//   drop_last: when N is not a multiple of G, N mod G utterances sit out the epoch: with shuffle a
//     subset drawn from (seed, epoch) (so over epochs every utterance is seen), without shuffle the
//     longest ones. batches_per_epoch = floor(N / G).
//   no drop_last: the partial global batch (the longest utterances) comes last and is split as the
//     image loader splits it: rank r takes [r g / world, (r + 1) g / world) of its g utterances, so a
//     rank's last batch may be small or empty (size 0). batches_per_epoch = ceil(N / G).
// Without sort_by_length the epoch order is a seeded permutation of [0, N) (identity without
// shuffle), cut the same way: the image loader's sampling exactly.
//
// A batch lists its utterances longest first (what packed-sequence RNN kernels want), ties by index.
// Features are batch x max_frames x feature_dim with zeros after each utterance's frames (zero is the
// normalized mean); labels are the CTC ids of all transcripts concatenated (an4.h).
//
// Augmentation (training): speed factor uniform in [1 - speed_perturb, 1 + speed_perturb] applied as
// time-axis resampling of the frames, then gain uniform in [-gain_perturb_db, +gain_perturb_db] dB,
// exact on the magnitudes (features.h); the features are normalized again afterwards. The random
// numbers of utterance i in epoch e come from (seed, e, i) only. Speed changes frame counts, so
// batch composition is fixed by the un-augmented lengths and `frames` reports the augmented ones.
//
// Background preparation: `threads` workers prepare batches ahead (a few at most); next() hands them
// out in order; a worker's exception is rethrown by the next() that asks for its batch. threads = 0
// prepares each batch inside next().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/an4.h"
#include "data/prefetch.h"

namespace trainer::data {

struct SpeechBatch {
  std::vector<float> features;         // size x max_frames x feature_dim, zero padded
  std::vector<int32_t> frames;         // size: true frame counts (after speed perturbation)
  std::vector<int32_t> labels;         // CTC ids of every transcript, concatenated in batch order
  std::vector<int32_t> label_lengths;  // size
  std::vector<std::string> transcripts;
  std::vector<int64_t> indices;        // size: each utterance's index in the SpeechSet
  int64_t size = 0, max_frames = 0, feature_dim = 0, epoch = 0, index = 0;
};

struct SpeechLoaderOptions {
  int64_t batch_size = 20;  // per rank
  int64_t global_batch = 0;  // as the image loader's (loader.h): 0 = world x batch_size
  bool shuffle = true;
  bool sort_by_length = true;  // bucketing
  bool drop_last = true;
  uint64_t seed = 0;
  int rank = 0, world = 1;
  int threads = 1;             // background workers; 0 = prepare synchronously in next()
  double speed_perturb = 0;    // e.g. 0.1: speed in [0.9, 1.1]; must be in [0, 1)
  double gain_perturb_db = 0;  // e.g. 6: gain in [-6, +6] dB
};

class SpeechLoader {
 public:
  // The set must outlive the loader. Throws std::invalid_argument for bad options, an empty set, or
  // fewer utterances than one global batch with drop_last.
  SpeechLoader(const SpeechSet& set, SpeechLoaderOptions opts);
  ~SpeechLoader();  // stops and joins the workers
  SpeechLoader(const SpeechLoader&) = delete;
  SpeechLoader& operator=(const SpeechLoader&) = delete;

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // The next call to next() returns batch `batch` of epoch `epoch`; batch may equal
  // batches_per_epoch(), meaning the first batch of the next epoch.
  void seek(int64_t epoch, int64_t batch);
  SpeechBatch next();

  // Epoch e's order: utterance indices, global batch after global batch (what the ranks slice).
  std::shared_ptr<const std::vector<int32_t>> order(int64_t epoch);

 private:
  SpeechBatch make_batch(int64_t sequence);  // sequence s = batch s % per_epoch of epoch s / per_epoch

  const SpeechSet& set_;
  SpeechLoaderOptions opts_;
  int64_t global_ = 0;  // utterances per global batch
  int64_t batches_per_epoch_ = 0;
  std::vector<int32_t> by_length_;  // indices sorted by (frames, index)

  std::mutex order_mutex_;
  std::map<int64_t, std::shared_ptr<const std::vector<int32_t>>> orders_;

  // Background preparation (data/prefetch.h); last, so its workers stop before the rest goes.
  std::unique_ptr<Prefetcher<SpeechBatch>> prefetch_;
};

}  // namespace trainer::data
