// The compressors on device buffers: the CPU backend dressed as a device (device_like_backend.h)
// runs every device branch, and each method must give the host path's bits: every step's output,
// the bytes each step sends and receives, and the saved state (thresholds, regions, factors, the
// residual). The sparse methods (comm/sync/methods/sparse/sparse_passes.h): the residual in "device" memory, the
// radix select and stream compaction as backend ops, the lists copied across, the output scattered
// from an uploaded list. PowerSGD: its factors and residual in "device" memory, every step a backend
// op (ErrorFeedback's device mode for materialize, adopt and sent_approximately).
// Gradients carry exact zeros and many ties (multiples of 1/16), so the tie rules are exercised.
// A checkpoint resumes across the two. Run under mpiexec with P = 1, 2 and 3.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/registry.h"
#include "comm/sync/methods/sparse/sparse_passes.h"
#include "tests/device_like_backend.h"
#include "tests/device_like_communicator.h"
#include "tests/method_keys.h"

using namespace trainer;

namespace {

constexpr int64_t kEntries = 6007;  // not a multiple of any block or chunk

std::vector<float> gradient(int step) {
  const int rank = comm::world().rank();
  std::mt19937 rng(7919 * step + 31 * rank + 5);
  std::normal_distribution<float> normal;
  std::vector<float> g(kEntries);
  for (int64_t i = 0; i < kEntries; ++i) {
    const float v = normal(rng);
    g[i] = i % 7 == 0 ? 0.f : i % 3 == 0 ? std::round(v * 16.f) / 16.f : v;  // zeros and ties
  }
  return g;
}

// Per step: the output and the bytes sent and received.
struct Run {
  std::vector<std::vector<float>> outputs;
  std::vector<int64_t> sent, received;
};

// Steps [from, to) of `sync` on the gradient held in `memory` (host or the device-like one).
Run train(comm::GradientSync& sync, models::DeviceMemory& memory, int from, int to,
          const std::vector<models::ParamView>* views = nullptr) {
  Run run;
  std::vector<float> params(kEntries, 0.5f);
  float* grads = static_cast<float*>(memory.allocate(kEntries * sizeof(float)));
  int64_t sent = 0, received = 0;
  comm::world().log().take_totals(sent, received);
  for (int step = from; step < to; ++step) {
    const std::vector<float> g = gradient(step);
    models::copy_to_device(memory, g.data(), kEntries, grads);
    comm::SyncBuffers b{params.data(), grads, kEntries, nullptr, 0, views};
    sync.reduce(b, step);
    run.outputs.emplace_back(kEntries);
    models::copy_to_host(memory, grads, kEntries, run.outputs.back().data());
    comm::world().log().take_totals(sent, received);
    run.sent.push_back(sent);
    run.received.push_back(received);
  }
  memory.free(grads);
  return run;
}

// Every step's output and bytes sent and received, equal.
void check_same_steps(const Run& a, const Run& b) {
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (size_t step = 0; step < a.outputs.size(); ++step) {
    INFO("step " << step);
    CHECK(a.outputs[step] == b.outputs[step]);
    CHECK(a.sent[step] == b.sent[step]);
    CHECK(a.received[step] == b.received[step]);
  }
}

std::string saved(const comm::GradientSync& sync) {
  std::ostringstream out;
  sync.save(out);
  return out.str();
}

comm::SyncOptions options(const char* method) {
  comm::SyncOptions o;
  o.method = method;
  testing::set_if_own(o, "density", 0.03);
  o.dense_warmup_steps = 2;
  testing::set_if_own(o, "local_threshold_every", 3);  // oktopk: exact and reused thresholds
  testing::set_if_own(o, "global_threshold_every", 2);
  testing::set_if_own(o, "region_every", 4);
  return o;
}

std::vector<const char*> methods() {
  std::vector<const char*> names{"oktopk", "topka", "gaussiank"};
  const int p = comm::world().size();
  if ((p & (p - 1)) == 0) names.push_back("gtopk");  // a power of two
  return names;
}

}  // namespace

TEST_CASE("the sparse methods on device buffers give the host path's bits", "[sparse][device]") {
  constexpr int kSteps = 14;
  for (const char* name : methods()) {
    for (const bool error_feedback : {true, false}) {
      SECTION(std::string(name) + (error_feedback ? "" : ", without error feedback")) {
        comm::SyncOptions o = options(name);
        o.set("error_feedback", error_feedback);
        auto host = comm::make_gradient_sync(o, comm::world(), kEntries, nullptr);
        models::DeviceLikeCpu device;
        o.backend = &device;
        auto device_comm = testing::device_like_communicator(device);
        auto on_device = comm::make_gradient_sync(o, *device_comm, kEntries, nullptr);
        CHECK_THAT(on_device->describe(), !Catch::Contains("through host memory"));

        const Run a = train(*host, models::host_memory(), 0, kSteps);
        const int64_t to_host_before = device.memory.to_host;
        const Run b = train(*on_device, device, 0, kSteps);
        check_same_steps(a, b);
        CHECK(saved(*host) == saved(*on_device));
        // Only lists and histograms came back (the outputs the test itself reads back aside): per
        // compressed step at most the four 1 KB histograms of an exact threshold and a few times
        // the k selected (index, value) pairs, not the gradient.
        const int64_t lists = device.memory.to_host - to_host_before - kSteps * kEntries * 4;
        const int64_t k = comm::top_k_count(o.get<double>("density"), kEntries);
        const int64_t compressed_steps = kSteps - o.dense_warmup_steps;
        INFO("bytes to the host per compressed step: " << lists / compressed_steps);
        CHECK(lists <= compressed_steps * (4 * 1024 + 3 * 8 * k));
      }
    }
  }
}

TEST_CASE("sync.dgc and the sparsity warm-up on device buffers give the host path's bits", "[sparse][device][dgc]") {
  // The velocity is a device buffer there: its update is Backend::momentum_correction, its masking
  // the device passes' clears (DgcMomentum, comm/sync/wrappers/dgc.h); on the host the pending clears.
  constexpr int kSteps = 14;
  for (const char* name : methods()) {
    for (const bool nesterov : {false, true}) {
      SECTION(std::string(name) + (nesterov ? ", Nesterov" : "")) {
        comm::SyncOptions o = options(name);
        o.set("dgc", true);
        o.set("density_warmup_steps", 8);
        o.set("density_warmup_stages", 2);
        o.recipe.momentum = 0.9;
        o.recipe.nesterov = nesterov;
        o.recipe.grad_clip_norm = 40.0;  // binds: the gradients' norm is about 75 per rank
        auto host = comm::make_gradient_sync(o, comm::world(), kEntries, nullptr);
        models::DeviceLikeCpu device;
        comm::SyncOptions od = o;
        od.backend = &device;
        auto device_comm = testing::device_like_communicator(device);
        auto on_device = comm::make_gradient_sync(od, *device_comm, kEntries, nullptr);
        CHECK_THAT(on_device->describe(), !Catch::Contains("through host memory"));
        check_same_steps(train(*host, models::host_memory(), 0, kSteps), train(*on_device, device, 0, kSteps));
        CHECK(saved(*host) == saved(*on_device));
        // Resumed on the other side, the same bits as the run that went on.
        auto resumed = comm::make_gradient_sync(o, comm::world(), kEntries, nullptr);
        std::istringstream state(saved(*on_device));
        resumed->load(state);
        check_same_steps(train(*resumed, models::host_memory(), kSteps, kSteps + 4),
                         train(*on_device, device, kSteps, kSteps + 4));
      }
    }
  }
}

TEST_CASE("a sparse method's checkpoint resumes across host and device", "[sparse][device]") {
  for (const char* name : methods()) {
    SECTION(name) {
      for (const bool host_first : {true, false}) {
        comm::SyncOptions o = options(name);
        models::DeviceLikeCpu device;
        comm::SyncOptions od = o;
        od.backend = &device;
        auto device_comm = testing::device_like_communicator(device);
        auto first = comm::make_gradient_sync(host_first ? o : od, host_first ? comm::world() : *device_comm, kEntries,
                                              nullptr);
        auto second = comm::make_gradient_sync(host_first ? od : o, host_first ? *device_comm : comm::world(), kEntries,
                                               nullptr);
        auto reference = comm::make_gradient_sync(o, comm::world(), kEntries, nullptr);
        models::DeviceMemory& first_memory = host_first ? models::host_memory() : static_cast<models::DeviceMemory&>(device);
        models::DeviceMemory& second_memory = host_first ? static_cast<models::DeviceMemory&>(device) : models::host_memory();
        train(*first, first_memory, 0, 8);
        train(*reference, models::host_memory(), 0, 8);
        std::istringstream state(saved(*first));
        second->load(state);
        const Run resumed = train(*second, second_memory, 8, 12);
        const Run straight = train(*reference, models::host_memory(), 8, 12);
        CHECK(resumed.outputs == straight.outputs);
        CHECK(saved(*second) == saved(*reference));
      }
    }
  }
}

TEST_CASE("select_top_k on the device passes matches select.h's on edge cases", "[sparse][device]") {
  models::DeviceLikeCpu device;
  struct Case {
    const char* what;
    std::vector<float> x;
    int64_t k;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases{
      {"fewer nonzeros than k", {0.f, 1.f, 0.f, -2.f, 0.f, 0.5f}, 5},
      {"all zeros", {0.f, 0.f, 0.f, 0.f}, 2},
      {"ties at the k-th magnitude", {1.f, -1.f, 2.f, 1.f, -1.f, 0.5f, 1.f}, 3},
      {"denormals and infinity", {1e-45f, -3e-45f, inf, 2.f, -inf, 1e-44f}, 4},
      {"k above n", {3.f, -1.f, 2.f}, 7},
  };
  for (const Case& c : cases) {
    for (const bool exactly_k : {false, true}) {
      INFO(c.what << (exactly_k ? ", exactly k" : ", threshold rule"));
      const auto n = static_cast<int64_t>(c.x.size());
      // Host: select.h directly, on a copy (the source forms acc = x + 0 into the residual).
      std::vector<float> residual(n, 0.f);
      comm::SparseList expected;
      comm::SelectScratch scratch;
      const float t_host = comm::select_top_k({c.x.data(), residual.data(), nullptr}, n, c.k, exactly_k, expected,
                                              scratch);
      // Device passes over the device-like backend.
      comm::ErrorFeedback ef(n, &device);
      comm::ErrorFeedback::Step step(ef, nullptr);
      auto passes = comm::make_device_sparse_passes(device, n);
      std::vector<float> grad = c.x;
      passes->begin(grad.data(), step);
      comm::SparseList got;
      const float t_device = passes->select_top_k(c.k, exactly_k, got);
      CHECK(t_device == t_host);
      REQUIRE(got.size() == expected.size());
      for (int64_t j = 0; j < got.size(); ++j) {
        CHECK(got.index()[j] == expected.index()[j]);
        CHECK(got.value()[j] == expected.value()[j]);
      }
    }
  }
}

TEST_CASE("PowerSGD on device buffers gives the host path's bits", "[powersgd][device]") {
  // A model whose tensors tile kEntries: matrices of several shapes (one repeated), a bias, and a
  // vector; several buckets.
  std::vector<models::ParamView> views;
  int64_t offset = 0;
  for (const models::Shape& shape : std::vector<models::Shape>{
           {40, 30}, {40}, {30, 20, 3}, {40, 30}, {25, 33}, {1}, {kEntries - 1200 - 40 - 1800 - 1200 - 825 - 1}}) {
    views.push_back({"t" + std::to_string(views.size()), offset, shape});
    offset += views.back().numel();
  }
  REQUIRE(offset == kEntries);
  for (const int64_t rank : {1, 3}) {
    SECTION("rank " + std::to_string(rank)) {
      comm::SyncOptions o;
      o.method = "powersgd";
      o.set("rank", rank);
      o.dense_warmup_steps = 2;
      o.bucket_mb = 0.006;  // about 1,500 floats a bucket
      o.first_bucket_mb = 0.003;
      auto host = comm::make_gradient_sync(o, comm::world(), kEntries, &views);
      models::DeviceLikeCpu device;
      o.backend = &device;
      auto device_comm = testing::device_like_communicator(device);
      auto on_device = comm::make_gradient_sync(o, *device_comm, kEntries, &views);
      CHECK_THAT(on_device->describe(), !Catch::Contains("through host memory"));
      constexpr int kSteps = 10;
      const Run a = train(*host, models::host_memory(), 0, kSteps, &views);
      const Run b = train(*on_device, device, 0, kSteps, &views);
      check_same_steps(a, b);
      CHECK(saved(*host) == saved(*on_device));
      // And a checkpoint of one resumes on the other.
      std::istringstream state(saved(*on_device));
      o.backend = nullptr;
      auto resumed_on_host = comm::make_gradient_sync(o, comm::world(), kEntries, &views);
      resumed_on_host->load(state);
      const Run c = train(*resumed_on_host, models::host_memory(), kSteps, kSteps + 3, &views);
      const Run d = train(*on_device, device, kSteps, kSteps + 3, &views);
      CHECK(c.outputs == d.outputs);
    }
  }
}
