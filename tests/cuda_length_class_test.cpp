// The CUDA convolution's length classes (models/cuda/length_class.h), on the CPU: the rule itself,
// and how many classes DeepSpeech's two convolutions see over epochs of a speech corpus's lengths
// as the speech loader batches them (each batch padded to its own longest utterance, unchanged):
// the number of cudnnFind searches a run makes is bounded by that count, where the exact time
// extents (what the search used to be keyed on) are new almost every batch.
//
// The lengths are an AN4-like corpus's (948 training utterances of 1 to 7 s, 10 ms frames, seeded),
// not AN4's own: the corpus is not in the repository.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>

#include "data/an4.h"
#include "data/speech_loader.h"
#include "models/cuda/length_class.h"

namespace {

using trainer::models::cuda::length_class;

// DeepSpeech's convolutions along time (models/nets/deepspeech.cpp): kernel 11, stride 2, pad 5, twice
// (conv 2 has stride 1 along time: kernel 11, pad 5 keeps the extent).
int64_t conv_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad) { return (in + 2 * pad - kernel) / stride + 1; }

trainer::data::SpeechSet corpus(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::gamma_distribution<double> seconds(4.0, 0.6);  // mean 2.4 s, as AN4's short utterances
  trainer::data::SpeechSet set;
  set.feature_dim = 1;
  for (int64_t i = 0; i < n; ++i) {
    trainer::data::Utterance u;
    u.id = "u" + std::to_string(i);
    u.transcript = "A";
    u.frames = static_cast<int32_t>(std::clamp(seconds(rng), 1.0, 7.0) * 100);
    u.features.assign(static_cast<size_t>(u.frames), 0.f);
    set.utterances.push_back(std::move(u));
  }
  return set;
}

struct Counts {
  std::set<std::tuple<int64_t, int64_t, int64_t>> exact, classes;  // (layer, batch, time extent)
};

Counts over_epochs(const trainer::data::SpeechSet& set, trainer::data::SpeechLoaderOptions o, int epochs) {
  trainer::data::SpeechLoader loader(set, o);
  Counts c;
  for (int64_t b = 0; b < epochs * loader.batches_per_epoch(); ++b) {
    const trainer::data::SpeechBatch batch = loader.next();
    const int64_t t1 = batch.max_frames, t2 = conv_out(t1, 11, 2, 5);
    for (auto [layer, t] : {std::pair<int64_t, int64_t>{1, t1}, {2, t2}}) {
      c.exact.insert({layer, batch.size, t});
      c.classes.insert({layer, batch.size, length_class(t)});
    }
  }
  return c;
}

}  // namespace

TEST_CASE("length classes: at most 25% above the extent, four per octave, monotone") {
  for (int64_t n = 1; n <= 16; ++n) CHECK(length_class(n) == n);
  std::set<int64_t> octave;
  for (int64_t n = 1; n <= 100000; ++n) {
    const int64_t c = length_class(n);
    REQUIRE(c >= n);
    REQUIRE(4 * c <= 5 * n + 4 * 16);  // c <= 1.25 n (+ one step at the octave's edge)
    REQUIRE(length_class(c) == c);     // a class is its own class
    if (n > 1) REQUIRE(c >= length_class(n - 1));
    if (n > 1024 && n <= 2048) octave.insert(c);
  }
  CHECK(octave == std::set<int64_t>{1280, 1536, 1792, 2048});
}

TEST_CASE("length classes: DeepSpeech's convolutions see a bounded number over epochs of speech batches") {
  const auto set = corpus(948, 43);
  trainer::data::SpeechLoaderOptions o;
  o.batch_size = 8;  // configs/an4_dense.toml's
  o.threads = 0;

  SECTION("bucketed by length (the default), shuffled, three epochs") {
    const Counts c = over_epochs(set, o, 3);
    INFO("exact extents " << c.exact.size() << ", classes " << c.classes.size());
    // 118 batches, each padded to its own longest: nearly every one a new extent for each layer.
    CHECK(c.exact.size() >= 100);
    // 1 to 7 s: 100..700 frames and 50..350 after conv 1, up to 3 octaves of 4 classes each per layer.
    CHECK(c.classes.size() <= 2 * 13);
  }
  SECTION("not bucketed: random batches, drop_last off (a smaller last batch)") {
    o.sort_by_length = false;
    o.drop_last = false;
    const Counts c = over_epochs(set, o, 3);
    INFO("exact extents " << c.exact.size() << ", classes " << c.classes.size());
    CHECK(c.exact.size() >= 100);
    CHECK(c.classes.size() <= 2 * 2 * 13);  // two batch sizes
  }
}
