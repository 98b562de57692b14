#include <time.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "data/cifar.h"
#include "data/loader.h"
#include "data/seeding.h"
#include "trainer/tools/bench.h"

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

data::ImageSet random_images(int64_t n) {
  data::ImageSet set;
  set.pixels.resize(n * data::kCifarImageBytes);
  set.labels.resize(n);
  uint64_t state = 1;
  for (size_t i = 0; i < set.pixels.size(); i += 8) {
    const uint64_t r = data::splitmix64(state);
    for (size_t k = 0; k < 8 && i + k < set.pixels.size(); ++k) set.pixels[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  for (int64_t i = 0; i < n; ++i) set.labels[i] = static_cast<uint8_t>(i % data::kCifarClasses);
  return set;
}

}  // namespace

int run_loader_bench(const LoaderBenchOptions& o) {
  if (o.batch < 1 || o.batches < 1 || o.warmup < 0) throw std::invalid_argument("bench loader: bad --batch, --batches or --warmup");
  const data::ImageSet set = o.data.empty() ? random_images(50000) : data::read_cifar10(o.data, true);
  const data::Normalization norm = data::channel_stats(set);
  std::printf("bench loader: %lld %s training images, batch %lld, %s, %lld batches after %lld\n",
              static_cast<long long>(set.size()), o.data.empty() ? "random in-memory" : o.data.c_str(),
              static_cast<long long>(o.batch), o.augment ? "augmented (crop with padding 4, flip)" : "not augmented",
              static_cast<long long>(o.batches), static_cast<long long>(o.warmup));
  nlohmann::json report{{"batch", o.batch}, {"images", set.size()}, {"augment", o.augment}, {"runs", nlohmann::json::array()}};
  for (int threads : o.threads) {
    if (threads < 0) throw std::invalid_argument("bench loader: --threads must be >= 0");
    data::LoaderOptions lo;
    lo.batch_size = o.batch;
    lo.augment = o.augment;
    lo.threads = threads;
    data::ImageLoader loader(set, norm, lo);
    for (int64_t i = 0; i < o.warmup; ++i) loader.next();
    // The consumer only takes the batches: what the workers deliver is the ceiling the training
    // loop sees when its step is shorter than a batch's preparation.
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    int64_t images = 0;
    for (int64_t i = 0; i < o.batches; ++i) images += loader.next().size;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - cpu0;
    const double rate = images / wall;
    // Images per CPU second holds on a busy machine, where the wall rate falls with the share of
    // the cores the workers get (cpu/wall below the worker count).
    std::printf("  %d loader thread%s  %9.0f images/s  %6.3f ms/batch  %5.2f cpu/wall  %9.0f images per cpu second\n",
                threads, threads == 1 ? " " : "s", rate, wall * 1e3 / o.batches, cpu / wall, images / cpu);
    report["runs"].push_back({{"threads", threads},
                              {"images_per_s", rate},
                              {"ms_per_batch", wall * 1e3 / o.batches},
                              {"cpu_per_wall", cpu / wall},
                              {"images_per_cpu_s", images / cpu}});
  }
  std::printf("  a ResNet-20 step of batch 128 in 4 ms on a GPU needs 32000 images/s\n");
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace trainer::app
