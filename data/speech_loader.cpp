#include "data/speech_loader.h"
#include "data/seeding.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include "data/features.h"

namespace trainer::data {

namespace {

constexpr uint64_t kOrderStream = 0x6f72646572ull;  // "order": epoch permutation / batch order
constexpr uint64_t kDropStream = 0x64726f70ull;     // "drop": who sits out an epoch with drop_last
constexpr uint64_t kAugmentStream = 0x61756773ull;  // "augs": per-utterance speed and gain

double uniform01(uint64_t& state) { return (splitmix64(state) >> 11) * 0x1.0p-53; }

}  // namespace

SpeechLoader::SpeechLoader(const SpeechSet& set, SpeechLoaderOptions opts) : set_(set), opts_(opts) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("speech loader: " + what); };
  if (opts_.batch_size < 1) bad("batch_size must be >= 1, got " + std::to_string(opts_.batch_size));
  if (opts_.world < 1) bad("world must be >= 1, got " + std::to_string(opts_.world));
  if (opts_.rank < 0 || opts_.rank >= opts_.world) {
    bad("rank " + std::to_string(opts_.rank) + " is outside [0, world = " + std::to_string(opts_.world) + ")");
  }
  if (opts_.threads < 0) bad("threads must be >= 0, got " + std::to_string(opts_.threads));
  if (!(opts_.speed_perturb >= 0 && opts_.speed_perturb < 1)) {
    bad("speed_perturb must be in [0, 1), got " + std::to_string(opts_.speed_perturb));
  }
  if (!(opts_.gain_perturb_db >= 0 && std::isfinite(opts_.gain_perturb_db))) {
    bad("gain_perturb_db must be >= 0, got " + std::to_string(opts_.gain_perturb_db));
  }
  const int64_t n = set_.size();
  if (n == 0) bad("the speech set is empty");
  if (n > INT32_MAX) bad("more than 2^31 - 1 utterances are not supported");
  if (set_.feature_dim < 1) bad("feature_dim must be >= 1");
  for (const Utterance& u : set_.utterances) {
    if (u.frames < 1 || static_cast<int64_t>(u.features.size()) != u.frames * set_.feature_dim) {
      bad("utterance '" + u.id + "' has " + std::to_string(u.features.size()) + " feature values for " +
          std::to_string(u.frames) + " frames of " + std::to_string(set_.feature_dim));
    }
    try {
      ctc_labels(u.transcript);
    } catch (const std::invalid_argument& e) {
      bad("utterance '" + u.id + "': " + e.what());
    }
  }
  if (opts_.global_batch < 0 || (opts_.global_batch > 0 && opts_.global_batch < opts_.world))
    bad("global_batch " + std::to_string(opts_.global_batch) + " leaves a rank of " + std::to_string(opts_.world) +
        " without utterances");
  const int64_t global = global_ = opts_.global_batch > 0 ? opts_.global_batch : opts_.batch_size * opts_.world;
  batches_per_epoch_ = opts_.drop_last ? n / global : (n + global - 1) / global;
  if (batches_per_epoch_ == 0) {
    bad(std::to_string(n) + " utterances are fewer than one global batch (" + std::to_string(global) + ": world " +
        std::to_string(opts_.world) + " x batch_size " + std::to_string(opts_.batch_size) + ") with drop_last");
  }
  by_length_.resize(n);
  for (int64_t i = 0; i < n; ++i) by_length_[i] = static_cast<int32_t>(i);
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [&](int32_t a, int32_t b) { return set_.utterances[a].frames < set_.utterances[b].frames; });

  prefetch_ = std::make_unique<Prefetcher<SpeechBatch>>(opts_.threads, [this](int64_t s) { return make_batch(s); });
}

SpeechLoader::~SpeechLoader() = default;

std::shared_ptr<const std::vector<int32_t>> SpeechLoader::order(int64_t epoch) {
  std::lock_guard<std::mutex> lock(order_mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;

  const int64_t n = set_.size(), global = global_;
  const uint64_t e = static_cast<uint64_t>(epoch);
  auto out = std::make_shared<std::vector<int32_t>>();
  if (!opts_.sort_by_length) {
    out->resize(n);
    for (int64_t i = 0; i < n; ++i) (*out)[i] = static_cast<int32_t>(i);
    if (opts_.shuffle) shuffle(*out, mix(opts_.seed, kOrderStream, e, 0));
  } else {
    std::vector<int32_t> kept = by_length_;
    const int64_t rest = n % global;
    if (opts_.drop_last && rest != 0) {
      if (opts_.shuffle) {
        // Draw `rest` sorted positions to leave out: the first `rest` of a seeded permutation.
        std::vector<int32_t> positions(n);
        for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
        shuffle(positions, mix(opts_.seed, kDropStream, e, 0));
        std::vector<char> out_of_epoch(n, 0);
        for (int64_t i = 0; i < rest; ++i) out_of_epoch[positions[i]] = 1;
        kept.clear();
        for (int64_t i = 0; i < n; ++i) {
          if (!out_of_epoch[i]) kept.push_back(by_length_[i]);
        }
      } else {
        kept.resize(n - rest);  // the longest sit out
      }
    }
    const int64_t full = static_cast<int64_t>(kept.size()) / global;
    std::vector<int64_t> batches(full);
    for (int64_t b = 0; b < full; ++b) batches[b] = b;
    if (opts_.shuffle) shuffle(batches, mix(opts_.seed, kOrderStream, e, 0));
    out->reserve(kept.size());
    for (int64_t b : batches) out->insert(out->end(), kept.begin() + b * global, kept.begin() + (b + 1) * global);
    out->insert(out->end(), kept.begin() + full * global, kept.end());  // the partial batch, if kept
  }
  // Workers near an epoch boundary need two orders at once; an evicted order still in use lives on
  // in its shared_ptr.
  if (orders_.size() >= 4) orders_.erase(orders_.begin());
  orders_.emplace(epoch, out);
  return out;
}

SpeechBatch SpeechLoader::make_batch(int64_t sequence) {
  SpeechBatch batch;
  batch.epoch = sequence / batches_per_epoch_;
  batch.index = sequence % batches_per_epoch_;
  batch.feature_dim = set_.feature_dim;
  std::shared_ptr<const std::vector<int32_t>> perm = order(batch.epoch);
  const int64_t world = opts_.world, rank = opts_.rank, dim = set_.feature_dim;
  const int64_t start = batch.index * global_;
  const int64_t g = std::min<int64_t>(global_, static_cast<int64_t>(perm->size()) - start);
  const int64_t lo = start + rank * g / world, hi = start + (rank + 1) * g / world;

  // Each utterance's features, augmented when asked (a copy only then).
  struct Item {
    int64_t index;
    const float* features;
    int64_t frames;
    std::vector<float> owned;
  };
  std::vector<Item> items;
  items.reserve(hi - lo);
  const bool augment = opts_.speed_perturb > 0 || opts_.gain_perturb_db > 0;
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t index = (*perm)[j];
    const Utterance& u = set_.utterances[index];
    Item item{index, u.features.data(), u.frames, {}};
    if (augment) {
      uint64_t state = mix(opts_.seed, kAugmentStream, static_cast<uint64_t>(batch.epoch), static_cast<uint64_t>(index));
      const double speed = 1.0 + opts_.speed_perturb * (2.0 * uniform01(state) - 1.0);
      const double gain_db = opts_.gain_perturb_db * (2.0 * uniform01(state) - 1.0);
      if (opts_.speed_perturb > 0) {
        item.owned = stretch_frames(u.features.data(), u.frames, dim, speed, &item.frames);
      } else {
        item.owned = u.features;
      }
      FeatureNorm norm = normalize_features(item.owned.data(), static_cast<int64_t>(item.owned.size()));
      // Back to the utterance's own scale first, so gain acts on the magnitudes it was computed from.
      FeatureNorm original{u.norm.mean + norm.mean * u.norm.std, u.norm.std * norm.std};
      if (opts_.gain_perturb_db > 0) {
        apply_gain(set_.features.kind, item.owned.data(), static_cast<int64_t>(item.owned.size()), original, gain_db);
      }
      item.features = item.owned.data();
    }
    items.push_back(std::move(item));
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.frames != b.frames ? a.frames > b.frames : a.index < b.index;
  });

  batch.size = static_cast<int64_t>(items.size());
  batch.max_frames = items.empty() ? 0 : items.front().frames;
  batch.features.assign(static_cast<size_t>(batch.size * batch.max_frames * dim), 0.0f);
  for (int64_t j = 0; j < batch.size; ++j) {
    const Item& item = items[j];
    const Utterance& u = set_.utterances[item.index];
    std::copy(item.features, item.features + item.frames * dim, batch.features.begin() + j * batch.max_frames * dim);
    batch.frames.push_back(static_cast<int32_t>(item.frames));
    std::vector<int32_t> ids = ctc_labels(u.transcript);
    batch.labels.insert(batch.labels.end(), ids.begin(), ids.end());
    batch.label_lengths.push_back(static_cast<int32_t>(ids.size()));
    batch.transcripts.push_back(u.transcript);
    batch.indices.push_back(item.index);
  }
  return batch;
}

void SpeechLoader::seek(int64_t epoch, int64_t batch) {
  if (epoch < 0 || batch < 0 || batch > batches_per_epoch_) {
    throw std::invalid_argument("speech loader: cannot seek to epoch " + std::to_string(epoch) + " batch " +
                                std::to_string(batch) + " (batches per epoch: " +
                                std::to_string(batches_per_epoch_) + ")");
  }
  prefetch_->restart(epoch * batches_per_epoch_ + batch);
}

SpeechBatch SpeechLoader::next() { return prefetch_->next(); }

}  // namespace trainer::data
