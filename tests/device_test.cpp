// The device seam (models/device_memory.h, device_buffer.h): storage is allocated through the device
// it belongs to, grows only, and moves with its owner; parameter stores initialise on the host and
// upload once; state reaches the host only through the device's copies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "models/backend.h"
#include "models/device_buffer.h"
#include "models/model.h"
#include "models/parameters.h"
#include "models/tensor.h"

using namespace trainer::models;

namespace {

// Host memory that counts what goes through it, so a test can see who allocates where and that
// every copy goes through the device's calls.
class CountingMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "counting"; }
  void* allocate(size_t bytes) override {
    ++allocations, live += 1, allocated_bytes += bytes;
    return host_memory().allocate(bytes);
  }
  void free(void* p) override {
    --live;
    host_memory().free(p);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    ++to_device, pending = true;
    host_memory().copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ++to_host, pending = true;
    host_memory().copy_to_host(dst, src, bytes);
  }
  void fill(int64_t n, float value, float* y) override {
    ++fills;
    host_memory().fill(n, value, y);
  }
  void synchronize() override { pending = false; }

  int allocations = 0, live = 0, to_device = 0, to_host = 0, fills = 0;
  size_t allocated_bytes = 0;
  bool pending = false;  // a copy was enqueued and nobody has waited for it
};

}  // namespace

TEST_CASE("DeviceBuffer allocates through its device, 64-byte aligned, grows only, and moves", "[device]") {
  CountingMemory memory;
  {
    DeviceBuffer b(memory, 10);
    CHECK(memory.allocations == 1);
    CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
    CHECK(b.size() == 10);
    b.resize(5);  // shrinking keeps the storage
    b.reserve(10);
    CHECK(memory.allocations == 1);
    b.reserve(11);
    CHECK(memory.allocations == 2);
    CHECK(memory.live == 1);  // the old storage went back when it grew
    DeviceBuffer moved = std::move(b);
    CHECK(b.data() == nullptr);
    CHECK(moved.memory() == &memory);
    CHECK(memory.live == 1);
  }
  CHECK(memory.live == 0);
  DeviceBuffer unbound;
  CHECK_THROWS_WITH(unbound.resize(1), Catch::Contains("before it was given a device"));
}

TEST_CASE("OwnedTensor storage lives on the device it was made for", "[device]") {
  CountingMemory memory;
  OwnedTensor t(memory);
  t.resize({2, 3, 4, 4});
  t.resize({2, 3, 2, 2});  // smaller: no new allocation
  CHECK(memory.allocations == 1);
  std::vector<OwnedTensor> v;
  resize_owned(v, 3, memory);
  for (auto& x : v) x.resize({8});
  CHECK(memory.allocations == 4);
  resize_owned(v, 1, memory);
  CHECK(memory.live == 2);
}

TEST_CASE("ParameterStore: zeroed on its device, initial values uploaded once, host copies through the device",
          "[device]") {
  CountingMemory memory;
  ParameterStore store(true);
  const int a = store.declare("a", {2, 3});
  const int b = store.declare("b", {4});
  store.allocate(memory);
  CHECK(&store.memory() == &memory);
  CHECK(memory.allocations == 2);  // values and gradients
  CHECK(memory.fills == 2);
  Tensor ia = store.initial_value(a), ib = store.initial_value(b);
  std::iota(ia.data, ia.data + ia.numel(), 1.f);
  ib.data[3] = -1.f;
  CHECK(store.values()[0] == 0.f);  // nothing reaches the device before the upload
  store.upload_initial_values();
  CHECK(memory.to_device == 1);
  CHECK_FALSE(memory.pending);  // the upload waited for its copy
  CHECK_THROWS_WITH(store.initial_value(a), Catch::Contains("outside allocate()"));

  const std::vector<float> host = store.host_values();
  CHECK(memory.to_host == 1);
  CHECK_FALSE(memory.pending);
  CHECK(host == std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0, 0, -1});

  const std::vector<float> back(10, 7.f);
  store.copy_values_from_host(back.data(), back.size() * sizeof(float));
  CHECK(store.host_values() == back);
  CHECK_THROWS_WITH(store.copy_values_from_host(back.data(), 11 * sizeof(float)), Catch::Contains("more bytes"));
}

TEST_CASE("A model's stores live on the model's backend and its initialization is uploaded", "[device]") {
  auto model = make_image_model({"resnet20", 10, 0.f}, cpu_backend(), 3);
  CHECK(&model->parameters().memory() == static_cast<DeviceMemory*>(&cpu_backend()));
  CHECK(&model->buffers().memory() == static_cast<DeviceMemory*>(&cpu_backend()));
  // BN running variances start at 1 and conv weights are random: the upload happened.
  const std::vector<float> buffers = model->buffers().host_values();
  CHECK(std::count(buffers.begin(), buffers.end(), 1.f) == static_cast<long>(buffers.size() / 2));
  const std::vector<float> params = model->parameters().host_values();
  CHECK(std::count(params.begin(), params.end(), 0.f) < static_cast<long>(params.size() / 10));
}

#ifdef TRAINER_HAS_CUDA
#include "models/cuda/cuda_device.h"
#include "skip.h"

// Runs on a machine with a GPU; elsewhere (CI, the build machine) it says why and is skipped.
TEST_CASE("CUDA device: memory, fill and copies through the stream (skips without a GPU)", "[device][cuda]") {
  DeviceMemory* gpu = nullptr;
  try {
    gpu = &cuda::cuda_device(0);
  } catch (const std::runtime_error& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("no usable GPU"));  // any other error fails, not skips
    trainer::testing::skip_test(e.what());
  }
  INFO(cuda::describe_cuda_device(0));
  CHECK(gpu->name() == "cuda");
  const int64_t n = 100003;  // not a multiple of the block size
  DeviceBuffer b(*gpu, n);
  CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
  gpu->fill(n, 3.5f, b.data());
  std::vector<float> host(n, 0.f);
  copy_to_host(*gpu, b.data(), n, host.data());
  CHECK(std::count(host.begin(), host.end(), 3.5f) == n);
  std::iota(host.begin(), host.end(), 0.f);
  copy_to_device(*gpu, host.data(), n, b.data());
  std::vector<float> back(n, -1.f);
  copy_to_host(*gpu, b.data(), n, back.data());
  CHECK(back == host);

  ParameterStore store(true);
  const int w = store.declare("w", {3, 5});
  store.allocate(*gpu);
  store.initial_value(w).data[7] = 2.f;
  store.upload_initial_values();
  std::vector<float> expected(15, 0.f);
  expected[7] = 2.f;
  CHECK(store.host_values() == expected);
}
#endif
