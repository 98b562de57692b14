// The CIFAR-10 input pipeline: reader (exact format, one-line errors naming the file), synthetic
// generator (determinism, balance, learnable classes), loader (sharding, augmentation, order across
// thread counts, resume).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/cifar.h"
#include "data/loader.h"
#include "data/synthetic_cifar.h"

#include "process.h"

namespace fs = std::filesystem;
using namespace trainer::data;
using Catch::Matchers::Contains;
using trainer::testing::TempDir;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// n records with pseudo-random pixels and the given first label; label of record r is
// (first_label + r) % 10.
std::vector<uint8_t> make_records(int n, int first_label, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * kCifarRecordBytes);
  for (int r = 0; r < n; ++r) {
    bytes[r * kCifarRecordBytes] = static_cast<uint8_t>((first_label + r) % 10);
    for (int i = 1; i < kCifarRecordBytes; ++i) {
      bytes[r * kCifarRecordBytes + i] = static_cast<uint8_t>(rng());
    }
  }
  return bytes;
}

// An in-memory set of n images whose pixels are random and whose labels are index % 10.
ImageSet make_set(int64_t n, uint32_t seed = 7) {
  ImageSet set;
  std::mt19937 rng(seed);
  set.pixels.resize(n * kCifarImageBytes);
  for (uint8_t& p : set.pixels) p = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < n; ++i) set.labels.push_back(static_cast<uint8_t>(i % 10));
  return set;
}

Normalization test_norm() { return Normalization{{0.5f, 0.4f, 0.3f}, {0.25f, 0.2f, 0.3f}}; }

// The loader's normalization, spelled out: computed in double, rounded to float.
float normalized(uint8_t v, const Normalization& norm, int c) {
  return static_cast<float>((v / 255.0 - norm.mean[c]) / norm.std[c]);
}

std::vector<Batch> take(ImageLoader& loader, int64_t count) {
  std::vector<Batch> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(loader.next());
  return out;
}

void require_same(const Batch& a, const Batch& b) {
  REQUIRE(a.epoch == b.epoch);
  REQUIRE(a.index == b.index);
  REQUIRE(a.size == b.size);
  REQUIRE(a.indices == b.indices);
  REQUIRE(a.labels == b.labels);
  REQUIRE(a.images == b.images);  // bit-identical
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Reader

TEST_CASE("read_cifar10 returns the exact records of all five train files in order", "[data][cifar]") {
  TempDir dir;
  std::vector<std::vector<uint8_t>> files;
  for (int f = 0; f < 5; ++f) {
    files.push_back(make_records(3 + f, f, 100 + f));  // 3, 4, 5, 6, 7 records
    write_bytes(dir.file("data_batch_" + std::to_string(f + 1) + ".bin"), files.back());
  }
  write_bytes(dir.file("test_batch.bin"), make_records(4, 9, 42));

  ImageSet train = read_cifar10(dir.path.string(), true);
  REQUIRE(train.size() == 25);
  REQUIRE(train.pixels.size() == 25u * kCifarImageBytes);
  int64_t i = 0;
  for (const auto& bytes : files) {
    for (size_t r = 0; r < bytes.size() / kCifarRecordBytes; ++r, ++i) {
      const uint8_t* rec = bytes.data() + r * kCifarRecordBytes;
      REQUIRE(train.labels[i] == rec[0]);
      REQUIRE(std::equal(rec + 1, rec + kCifarRecordBytes, train.image(i)));
    }
  }

  ImageSet test = read_cifar10(dir.path.string(), false);
  REQUIRE(test.size() == 4);
  REQUIRE(test.labels == std::vector<uint8_t>{9, 0, 1, 2});
  std::vector<uint8_t> raw = read_bytes(dir.file("test_batch.bin"));
  REQUIRE(std::equal(raw.begin() + 1, raw.begin() + kCifarRecordBytes, test.image(0)));

  ImageSet two = read_cifar10_files({dir.file("data_batch_2.bin"), dir.file("test_batch.bin")});
  REQUIRE(two.size() == 8);
  REQUIRE(two.labels[0] == 1);
  REQUIRE(two.labels[4] == 9);
}

TEST_CASE("read_cifar10 rejects bad files with one line naming the file", "[data][cifar]") {
  TempDir dir;
  const std::string path = dir.file("test_batch.bin");

  SECTION("missing file") {
    REQUIRE_THROWS_WITH(read_cifar10(dir.path.string(), false),
                        Contains("missing file " + path) && Contains("data.root = " + dir.path.string()) &&
                            Contains("data_batch_1.bin..data_batch_5.bin"));
    // The train split names its first missing file.
    REQUIRE_THROWS_WITH(read_cifar10(dir.path.string(), true), Contains(dir.file("data_batch_1.bin")));
  }
  SECTION("truncated file") {
    std::vector<uint8_t> bytes = make_records(3, 0, 1);
    bytes.resize(bytes.size() - 10);
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(read_cifar10(dir.path.string(), false),
                        Contains(path + ": size 9209 bytes is not a multiple of the 3073-byte "
                                        "CIFAR-10 record"));
  }
  SECTION("empty file") {
    write_bytes(path, {});
    REQUIRE_THROWS_WITH(read_cifar10(dir.path.string(), false), Contains(path) && Contains("empty"));
  }
  SECTION("label out of range") {
    std::vector<uint8_t> bytes = make_records(20, 0, 1);
    bytes[17 * kCifarRecordBytes] = 12;
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(read_cifar10_files({path}),
                        Contains(path + ": record 17 has label 12 (CIFAR-10 labels are 0..9)"));
  }
  SECTION("a folder where a file should be") {
    fs::create_directories(path);
    REQUIRE_THROWS_WITH(read_cifar10(dir.path.string(), false), Contains(path));
  }
}

// ---------------------------------------------------------------------------------------------------
// Synthetic generator

TEST_CASE("synthetic CIFAR-10 is deterministic, in the exact format, and split over five files",
          "[data][synthetic]") {
  TempDir a, b, c;
  write_synthetic_cifar10(a.path.string(), 53, 17, 5);
  write_synthetic_cifar10(b.path.string(), 53, 17, 5);
  write_synthetic_cifar10(c.path.string(), 53, 17, 6);

  const std::vector<int64_t> expected = {11, 11, 11, 10, 10};  // 53 as evenly as possible
  std::vector<std::string> names;
  for (int f = 1; f <= 5; ++f) names.push_back("data_batch_" + std::to_string(f) + ".bin");
  names.push_back("test_batch.bin");
  for (size_t f = 0; f < names.size(); ++f) {
    std::vector<uint8_t> ba = read_bytes(a.file(names[f])), bb = read_bytes(b.file(names[f]));
    int64_t records = f < 5 ? expected[f] : 17;
    REQUIRE(static_cast<int64_t>(ba.size()) == records * kCifarRecordBytes);
    REQUIRE(ba == bb);                              // same seed: same bytes
    REQUIRE(ba != read_bytes(c.file(names[f])));  // other seed: other bytes
  }
  REQUIRE(fs::exists(a.file("README.txt")));
  std::vector<uint8_t> readme = read_bytes(a.file("README.txt"));
  std::string text(readme.begin(), readme.end());
  REQUIRE_THAT(text, Contains("synthetic") || Contains("Synthetic"));
  REQUIRE_THAT(text, Contains("seed = 5"));
  // Nothing but the final files is left behind (temporary files were renamed).
  REQUIRE(std::distance(fs::directory_iterator(a.path), fs::directory_iterator{}) == 7);

  ImageSet train = read_cifar10(a.path.string(), true);
  REQUIRE(train.size() == 53);

  REQUIRE_THROWS_AS(write_synthetic_cifar10(a.file("x"), 4, 1, 0), std::invalid_argument);
}

namespace {

// What the class statistics of a synthetic dataset say about its labels.
struct ClassEvidence {
  int64_t count_spread = 0;      // largest minus smallest class count, over both splits
  double min_mean_rms = 0;       // smallest RMS distance (grey levels) between two class-mean images
  double edge_accuracy = 0;      // held-out nearest centroid on four directional edge energies
  double colour_accuracy = 0;    // held-out nearest centroid on the mean colour
};

ClassEvidence class_evidence(const std::string& dir) {
  ImageSet train = read_cifar10(dir, true);
  ImageSet test = read_cifar10(dir, false);
  ClassEvidence e;
  for (const ImageSet* set : {&train, &test}) {
    std::vector<int64_t> counts(10, 0);
    for (uint8_t l : set->labels) ++counts[l];
    auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
    e.count_spread = std::max(e.count_spread, *hi - *lo);
  }

  std::vector<std::vector<double>> mean_image(10, std::vector<double>(kCifarImageBytes, 0.0));
  std::vector<int64_t> counts(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) {
    int l = train.labels[i];
    ++counts[l];
    for (int p = 0; p < kCifarImageBytes; ++p) mean_image[l][p] += train.image(i)[p];
  }
  for (int l = 0; l < 10; ++l) {
    for (int p = 0; p < kCifarImageBytes; ++p) mean_image[l][p] /= counts[l];
  }
  e.min_mean_rms = 1e300;
  for (int a = 0; a < 10; ++a) {
    for (int b = a + 1; b < 10; ++b) {
      double sq = 0;
      for (int p = 0; p < kCifarImageBytes; ++p) sq += std::pow(mean_image[a][p] - mean_image[b][p], 2);
      e.min_mean_rms = std::min(e.min_mean_rms, std::sqrt(sq / kCifarImageBytes));
    }
  }

  auto edge_features = [](const uint8_t* img) {
    std::array<double, 4> f{0, 0, 0, 0};
    auto grey = [&](int y, int x) {
      return (img[y * 32 + x] + img[1024 + y * 32 + x] + img[2048 + y * 32 + x]) / 3.0;
    };
    for (int y = 0; y < 31; ++y) {
      for (int x = 0; x < 31; ++x) {
        f[0] += std::fabs(grey(y, x + 1) - grey(y, x));
        f[1] += std::fabs(grey(y + 1, x) - grey(y, x));
        f[2] += std::fabs(grey(y + 1, x + 1) - grey(y, x));
        f[3] += std::fabs(grey(y + 1, x) - grey(y, x + 1));
      }
    }
    double total = f[0] + f[1] + f[2] + f[3] + 1e-9;
    for (double& v : f) v /= total;
    return f;
  };
  auto colour_features = [](const uint8_t* img) {
    std::array<double, 3> f{0, 0, 0};
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < kCifarPlaneBytes; ++p) f[c] += img[c * kCifarPlaneBytes + p];
      f[c] /= kCifarPlaneBytes;
    }
    return f;
  };
  auto centroid_accuracy = [&](auto features) {
    using F = decltype(features(train.image(0)));
    std::vector<F> centroid(10, F{});
    for (int64_t i = 0; i < train.size(); ++i) {
      F f = features(train.image(i));
      for (size_t k = 0; k < f.size(); ++k) centroid[train.labels[i]][k] += f[k] / counts[train.labels[i]];
    }
    int hits = 0;
    for (int64_t i = 0; i < test.size(); ++i) {
      F f = features(test.image(i));
      int best = 0;
      double best_d = 1e300;
      for (int l = 0; l < 10; ++l) {
        double d = 0;
        for (size_t k = 0; k < f.size(); ++k) d += (f[k] - centroid[l][k]) * (f[k] - centroid[l][k]);
        if (d < best_d) best_d = d, best = l;
      }
      hits += best == test.labels[i];
    }
    return hits / static_cast<double>(test.size());
  };
  e.edge_accuracy = centroid_accuracy(edge_features);
  e.colour_accuracy = centroid_accuracy(colour_features);
  return e;
}

// FNV-1a over the six data files, in order: a fingerprint of a dataset's bytes.
uint64_t dataset_fingerprint(const TempDir& dir) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"}) {
    for (uint8_t byte : read_bytes(dir.file(name))) h = (h ^ byte) * 0x100000001b3ull;
  }
  return h;
}

// dataset_fingerprint of write_synthetic_cifar10(dir, 53, 17, 5) as the easy generator wrote it
// before the hard variant was added (sha256 of the files compared equal before and after).
constexpr uint64_t kEasyFingerprint = 0xdb990a7d9cb56212ull;

}  // namespace

TEST_CASE("synthetic CIFAR-10 classes are balanced and differ in content, not in colour alone",
          "[data][synthetic]") {
  TempDir dir;
  write_synthetic_cifar10(dir.path.string(), 3000, 1000, 11);
  ClassEvidence e = class_evidence(dir.path.string());
  INFO("nearest centroid: edge directions " << e.edge_accuracy << ", mean colour " << e.colour_accuracy
       << "; closest class means " << e.min_mean_rms);
  REQUIRE(e.count_spread <= 1);
  // Per-class mean images differ (a sanity check: neighbouring class hues make some pairs close).
  REQUIRE(e.min_mean_rms > 2.0);  // grey levels, RMS
  // Held out, nearest class centroid: on four directional edge energies of the grey image (what
  // stripes, checkers and outlines change) it beats chance (10%) clearly, so the labels are carried
  // by shape and texture; on the mean colour it stays near chance. (Measured: 0.33 and 0.11.)
  REQUIRE(e.edge_accuracy > 0.25);
  REQUIRE(e.colour_accuracy < 0.2);
}

TEST_CASE("the easy variant's bytes are the ones written before the hard variant existed", "[data][synthetic]") {
  // Recorded from the generator before data.synthetic_variant was added (the quickstart's data, and
  // every easy result in the journal, depend on these bytes staying put).
  TempDir dir;
  write_synthetic_cifar10(dir.path.string(), 53, 17, 5);
  REQUIRE(dataset_fingerprint(dir) == kEasyFingerprint);
}

TEST_CASE("the hard variant is deterministic, other than the easy one, and named in README.txt",
          "[data][synthetic]") {
  TempDir a, b, easy;
  write_synthetic_cifar10(a.path.string(), 53, 17, 5, SyntheticVariant::kHard);
  write_synthetic_cifar10(b.path.string(), 53, 17, 5, SyntheticVariant::kHard);
  write_synthetic_cifar10(easy.path.string(), 53, 17, 5, SyntheticVariant::kEasy);
  REQUIRE(dataset_fingerprint(a) == dataset_fingerprint(b));
  REQUIRE(dataset_fingerprint(a) != dataset_fingerprint(easy));
  REQUIRE(read_cifar10(a.path.string(), true).size() == 53);
  REQUIRE(read_cifar10(a.path.string(), false).size() == 17);

  REQUIRE(synthetic_variant_in(a.path.string()) == SyntheticVariant::kHard);
  REQUIRE(synthetic_variant_in(easy.path.string()) == SyntheticVariant::kEasy);
  // A synthetic README from before the variant line is easy; a folder without ours is no variant.
  std::vector<uint8_t> readme = read_bytes(easy.file("README.txt"));
  std::string text(readme.begin(), readme.end());
  const std::string line = "variant = easy\n";
  REQUIRE(text.find(line) != std::string::npos);
  text.erase(text.find(line), line.size());
  write_bytes(easy.file("README.txt"), std::vector<uint8_t>(text.begin(), text.end()));
  REQUIRE(synthetic_variant_in(easy.path.string()) == SyntheticVariant::kEasy);
  fs::remove(easy.file("README.txt"));
  REQUIRE_FALSE(synthetic_variant_in(easy.path.string()).has_value());

  REQUIRE(parse_synthetic_variant("hard") == SyntheticVariant::kHard);
  REQUIRE_FALSE(parse_synthetic_variant("Hard").has_value());
}

TEST_CASE("hard synthetic CIFAR-10 is balanced, carried by content, and colour says nothing",
          "[data][synthetic]") {
  TempDir dir;
  write_synthetic_cifar10(dir.path.string(), 3000, 1000, 11, SyntheticVariant::kHard);
  ClassEvidence e = class_evidence(dir.path.string());
  INFO("nearest centroid: edge directions " << e.edge_accuracy << ", mean colour " << e.colour_accuracy
       << "; closest class means " << e.min_mean_rms);
  REQUIRE(e.count_spread <= 1);
  // The hue is uniform for every class, so colour is at chance; the edge statistic still sees the
  // stripes' direction, less clearly than on easy data. (Measured: 0.22 and 0.09.)
  REQUIRE(e.colour_accuracy < 0.15);
  REQUIRE(e.edge_accuracy > 0.15);
}

// ---------------------------------------------------------------------------------------------------
// Loader

TEST_CASE("channel_stats is the per-channel mean and std of pixels in [0, 1]", "[data][loader]") {
  ImageSet set = make_set(5);
  Normalization norm = channel_stats(set);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sq = 0, n = 5.0 * kCifarPlaneBytes;
    for (int64_t i = 0; i < 5; ++i) {
      for (int p = 0; p < kCifarPlaneBytes; ++p) {
        double x = set.image(i)[c * kCifarPlaneBytes + p] / 255.0;
        sum += x, sq += x * x;
      }
    }
    double mean = sum / n;
    REQUIRE(norm.mean[c] == Approx(mean).epsilon(1e-6));
    REQUIRE(norm.std[c] == Approx(std::sqrt(sq / n - mean * mean)).epsilon(1e-5));
  }
  ImageSet flat = make_set(2);
  std::fill(flat.pixels.begin(), flat.pixels.end(), 128);
  REQUIRE(channel_stats(flat).std[0] == 1.0f);  // constant channel: no division by zero
}

TEST_CASE("without augmentation a batch is the normalized source pixels in NHWC order", "[data][loader]") {
  ImageSet set = make_set(40);
  Normalization norm = test_norm();
  LoaderOptions opts;
  opts.batch_size = 8;
  opts.seed = 3;
  opts.threads = 1;
  ImageLoader loader(set, norm, opts);
  for (int k = 0; k < 6; ++k) {  // crosses into the second epoch
    Batch batch = loader.next();
    REQUIRE(batch.size == 8);
    REQUIRE(batch.images.size() == 8u * 32 * 32 * 3);
    for (int64_t j = 0; j < batch.size; ++j) {
      const uint8_t* src = set.image(batch.indices[j]);
      REQUIRE(batch.labels[j] == set.labels[batch.indices[j]]);
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) {
          for (int c = 0; c < 3; ++c) {
            float got = batch.images[((j * 32 + y) * 32 + x) * 3 + c];
            REQUIRE(got == normalized(src[c * 1024 + y * 32 + x], norm, c));
          }
        }
      }
    }
  }
}

TEST_CASE("every sample appears once per epoch across ranks, and ranks split the single-process batch",
          "[data][loader]") {
  const int64_t n = 103, batch = 4;
  ImageSet set = make_set(n);
  for (int world : {1, 2, 3}) {
    INFO("world " << world);
    LoaderOptions one;
    one.batch_size = batch * world;
    one.seed = 99;
    one.threads = 0;
    ImageLoader single(set, test_norm(), one);

    std::vector<std::unique_ptr<ImageLoader>> ranks;
    for (int r = 0; r < world; ++r) {
      LoaderOptions o = one;
      o.batch_size = batch;
      o.rank = r;
      o.world = world;
      o.threads = 2;
      ranks.push_back(std::make_unique<ImageLoader>(set, test_norm(), o));
      REQUIRE(ranks.back()->batches_per_epoch() == n / (batch * world));
    }
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::set<int64_t> seen;
      for (int64_t b = 0; b < single.batches_per_epoch(); ++b) {
        Batch whole = single.next();
        std::vector<int64_t> joined;
        for (int r = 0; r < world; ++r) {
          Batch part = ranks[r]->next();
          REQUIRE(part.size == batch);
          REQUIRE(part.epoch == epoch);
          REQUIRE(part.index == b);
          joined.insert(joined.end(), part.indices.begin(), part.indices.end());
        }
        REQUIRE(joined == whole.indices);
        for (int64_t i : joined) REQUIRE(seen.insert(i).second);  // never twice in an epoch
      }
      REQUIRE(static_cast<int64_t>(seen.size()) == n / (batch * world) * batch * world);
    }
  }
}

TEST_CASE("epochs are reshuffled and the order depends on the seed", "[data][loader]") {
  ImageSet set = make_set(64);
  auto order_of = [&](uint64_t seed, int epochs) {
    LoaderOptions o;
    o.batch_size = 64;
    o.seed = seed;
    o.threads = 0;
    ImageLoader loader(set, test_norm(), o);
    std::vector<std::vector<int64_t>> orders;
    for (int e = 0; e < epochs; ++e) orders.push_back(loader.next().indices);
    return orders;
  };
  auto a = order_of(1, 2), b = order_of(2, 1);
  REQUIRE(a[0] != a[1]);
  REQUIRE(a[0] != b[0]);
  std::vector<int64_t> sorted = a[0];
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 64; ++i) REQUIRE(sorted[i] == i);
}

TEST_CASE("evaluation order keeps every sample exactly once, partial batches included", "[data][loader]") {
  ImageSet set = make_set(2000);
  LoaderOptions o;
  o.batch_size = 128;
  o.shuffle = false;
  o.drop_last = false;
  ImageLoader loader(set, test_norm(), o);
  REQUIRE(loader.batches_per_epoch() == 16);
  int64_t expect = 0;
  for (int64_t b = 0; b < 16; ++b) {
    Batch batch = loader.next();
    REQUIRE(batch.size == (b < 15 ? 128 : 2000 - 15 * 128));
    for (int64_t i : batch.indices) REQUIRE(i == expect++);
  }
  REQUIRE(expect == 2000);

  // Three ranks: the same number of batches each; the last global batch (2000 - 5 * 384 = 80) is
  // split 26 / 27 / 27; together every sample exactly once.
  std::vector<int64_t> count(2000, 0);
  for (int r = 0; r < 3; ++r) {
    LoaderOptions ro = o;
    ro.rank = r;
    ro.world = 3;
    ImageLoader rl(set, test_norm(), ro);
    REQUIRE(rl.batches_per_epoch() == 6);
    for (int64_t b = 0; b < 6; ++b) {
      Batch batch = rl.next();
      if (b == 5) REQUIRE(batch.size == (r == 0 ? 26 : 27));
      for (int64_t i : batch.indices) ++count[i];
    }
  }
  REQUIRE(std::all_of(count.begin(), count.end(), [](int64_t c) { return c == 1; }));

  // A rank can get an empty final batch: 3 samples, batch 2, world 4 split as 0 / 1 / 1 / 1.
  ImageSet small = make_set(3);
  LoaderOptions so = o;
  so.batch_size = 2;
  so.world = 4;
  for (int r = 0; r < 4; ++r) {
    so.rank = r;
    ImageLoader sl(small, test_norm(), so);
    REQUIRE(sl.batches_per_epoch() == 1);
    Batch b = sl.next();
    REQUIRE(b.size == (r == 0 ? 0 : 1));
    REQUIRE(b.images.size() == static_cast<size_t>(b.size) * kCifarImageBytes);
  }
}

TEST_CASE("augmentation is a padded random crop plus flip, drawn per (seed, epoch, sample)",
          "[data][loader]") {
  ImageSet set = make_set(64);
  Normalization norm = test_norm();
  LoaderOptions o;
  o.batch_size = 64;
  o.augment = true;
  o.seed = 5;
  o.threads = 0;
  ImageLoader loader(set, norm, o);
  std::map<std::pair<int, int>, int> offsets;
  int flips = 0, total = 0;
  for (int epoch = 0; epoch < 4; ++epoch) {
    Batch batch = loader.next();
    for (int64_t j = 0; j < batch.size; ++j) {
      const uint8_t* src = set.image(batch.indices[j]);
      const float* out = batch.images.data() + j * kCifarImageBytes;
      // Find the crop origin and flip that reproduce the output exactly.
      bool found = false;
      for (int oy = 0; oy <= 8 && !found; ++oy) {
        for (int ox = 0; ox <= 8 && !found; ++ox) {
          for (int flip = 0; flip < 2 && !found; ++flip) {
            bool match = true;
            for (int y = 0; y < 32 && match; ++y) {
              for (int x = 0; x < 32 && match; ++x) {
                int sy = y + oy - 4, sx = (flip ? 31 - x : x) + ox - 4;
                bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
                for (int c = 0; c < 3 && match; ++c) {
                  uint8_t v = inside ? src[c * 1024 + sy * 32 + sx] : 0;  // zero padding, raw space
                  match = out[(y * 32 + x) * 3 + c] == normalized(v, norm, c);
                }
              }
            }
            if (match) {
              found = true;
              ++offsets[{oy, ox}];
              flips += flip;
              ++total;
            }
          }
        }
      }
      REQUIRE(found);
    }
  }
  // 256 draws: most of the 81 crop origins occur, and about half the images are flipped.
  REQUIRE(offsets.size() > 60);
  REQUIRE(flips > total * 0.35);
  REQUIRE(flips < total * 0.65);
}

TEST_CASE("batches do not depend on the number of worker threads", "[data][loader]") {
  ImageSet set = make_set(150);
  auto run = [&](int threads) {
    LoaderOptions o;
    o.batch_size = 16;
    o.augment = true;
    o.seed = 17;
    o.world = 2;
    o.rank = 1;
    o.threads = threads;
    ImageLoader loader(set, test_norm(), o);
    return take(loader, 2 * loader.batches_per_epoch() + 1);  // two epochs and a bit
  };
  std::vector<Batch> base = run(0);
  for (int threads : {1, 3}) {
    INFO("threads " << threads);
    std::vector<Batch> other = run(threads);
    REQUIRE(other.size() == base.size());
    for (size_t i = 0; i < base.size(); ++i) require_same(base[i], other[i]);
  }
}

TEST_CASE("seek(e, b) resumes exactly where a fresh loader's batch b of epoch e is", "[data][loader]") {
  ImageSet set = make_set(100);
  LoaderOptions o;
  o.batch_size = 8;
  o.augment = true;
  o.seed = 23;
  o.threads = 2;
  ImageLoader reference(set, test_norm(), o);
  const int64_t per_epoch = reference.batches_per_epoch();
  REQUIRE(per_epoch == 12);
  std::vector<Batch> all = take(reference, 3 * per_epoch);

  for (int threads : {0, 2}) {
    INFO("threads " << threads);
    o.threads = threads;
    ImageLoader fresh(set, test_norm(), o);
    fresh.seek(1, 5);
    require_same(fresh.next(), all[per_epoch + 5]);
    require_same(fresh.next(), all[per_epoch + 6]);

    // Seeking back after the workers have run ahead drops what they prepared.
    ImageLoader busy(set, test_norm(), o);
    take(busy, 3);
    busy.seek(2, 0);
    require_same(busy.next(), all[2 * per_epoch]);
    busy.seek(0, per_epoch);  // one past the last batch of epoch 0 = the first of epoch 1
    require_same(busy.next(), all[per_epoch]);
    REQUIRE_THROWS_AS(busy.seek(0, per_epoch + 1), std::invalid_argument);
  }
}

TEST_CASE("loader options are validated and destruction never waits for the consumer", "[data][loader]") {
  ImageSet set = make_set(10);
  LoaderOptions o;
  o.batch_size = 11;
  REQUIRE_THROWS_WITH(ImageLoader(set, test_norm(), o), Contains("fewer than one global batch"));
  o.batch_size = 2;
  o.rank = 2;
  o.world = 2;
  REQUIRE_THROWS_AS(ImageLoader(set, test_norm(), o), std::invalid_argument);
  // Workers that filled the queue and wait for a consumer that never comes must still stop.
  o.rank = 0;
  o.threads = 4;
  for (int i = 0; i < 20; ++i) {
    ImageLoader loader(set, test_norm(), o);
    if (i % 2) loader.next();
  }
}
