// sync.wire_dtype and sync.overlap on the GPU against the CPU (models/cuda/half_cast.cu,
// models/cuda/cuda_device.cpp's second stream, comm/sync/methods/dense/dense.h on device buffers):
//   - to_half / from_half give the CPU's 16 and 32 bits exactly (outputs poisoned first; random
//     values, ties, fp32 and fp16 subnormals, values at fp16's overflow edge, Inf, NaN payloads,
//     signed zeros; with fp16's pre-scale);
//   - sum_of_squares_into writes the CPU's sum (within double rounding: another order) and is not
//     finite exactly when the input is not;
//   - the second stream: a copy there after wait(mark) sees the compute stream's work before the
//     mark, and after join_owner the compute stream sees the second stream's;
//   - dense sync on GPU buffers (the staged communicator; overlapped on the second stream or not,
//     fp32, bf16, fp16) gives the CPU's dense sync's bits, and names a non-finite tensor as it does.
// Under mpiexec (scripts/gpu_check.sh: P = 2 sharing the GPU through staged MPI) the exchanges are
// real; NCCL's path (one GPU per rank) is not exercised here.
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "comm/communicator.h"
#include "models/float_bits.h"
#include "comm/staged_communicator.h"
#include "comm/sync/methods/dense/dense.h"
#include "tests/cuda_parity.h"

using namespace trainer;
using namespace trainer::cuda_testing;

namespace {

float from_bits(uint32_t b) { return models::float_of(b); }

// Random floats of every magnitude class the casts treat apart, and the edges themselves.
std::vector<float> cast_inputs(int64_t n, uint64_t seed) {
  std::vector<float> v = random_vector(n, seed, -3.f, 3.f);
  const std::vector<float> edges{0.f, -0.f, 65504.f, 65519.99f, 65520.f, -65520.f, 70000.f, 1e30f, -1e-30f,
                                 std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                 from_bits(0x7fc00001u), from_bits(0xffa12345u), from_bits(0x7f800001u),
                                 from_bits(0x00000001u), from_bits(0x807fffffu), 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                                 0x1p-14f, 0x1.ffcp-15f, 1.f + 0x1p-8f, 1.f + 0x1p-11f, 1.f + 0x1.8p-11f};
  std::mt19937_64 rng(seed + 1);
  for (int64_t i = 0; i < n; ++i) {
    switch (i % 7) {
      case 0: v[i] = edges[static_cast<size_t>(i / 7) % edges.size()]; break;
      case 1: v[i] = from_bits(static_cast<uint32_t>(rng()));  break;  // any pattern, NaNs included
      case 2: v[i] *= 1e-6f; break;                                    // fp16 subnormals
      case 3: v[i] = std::ldexp(std::round(std::ldexp(v[i], 12)), -12); break;  // ties of both formats
      case 4: v[i] *= 30000.f; break;                                  // near fp16's largest
      default: break;
    }
  }
  return v;
}

// A device array of 16-bit values, poisoned with a pattern no cast here produces from these inputs
// in every slot.
struct HalfArray {
  models::DeviceBuffer buffer;
  int64_t n;
  explicit HalfArray(int64_t count) : buffer(gpu(), std::max<int64_t>(1, (count + 1) / 2)), n(count) {
    std::vector<uint16_t> poison(static_cast<size_t>(2 * buffer.size()), 0xdead);
    gpu().copy_to_device(buffer.data(), poison.data(), poison.size() * 2);
    gpu().synchronize();
  }
  uint16_t* data() { return reinterpret_cast<uint16_t*>(buffer.data()); }
  std::vector<uint16_t> host() {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    gpu().copy_to_host(h.data(), data(), h.size() * 2);
    gpu().synchronize();
    return h;
  }
};

const std::vector<int64_t> kSizes{1, 7, 255, 4097, 70001};

}  // namespace

TEST_CASE("to_half and from_half on the GPU give the CPU's bits", "[wire]") {
  for (const models::HalfFormat format : {models::HalfFormat::kBf16, models::HalfFormat::kFp16}) {
    for (const float scale : {1.f, 0.5f, 1.f / 3.f}) {
      for (const int64_t n : kSizes) {
        INFO("format " << (format == models::HalfFormat::kBf16 ? "bf16" : "fp16") << ", scale " << scale << ", n " << n);
        const std::vector<float> x = cast_inputs(n, 11 + n);
        std::vector<uint16_t> want(static_cast<size_t>(n));
        cpu().to_half(format, n, x.data(), scale, want.data());
        GpuArray gx(x);
        HalfArray got(n);
        gpu().to_half(format, n, gx.data(), scale, got.data());
        const std::vector<uint16_t> g = got.host();
        int64_t first_bad = -1;
        for (int64_t i = 0; i < n && first_bad < 0; ++i)
          if (g[i] != want[i]) first_bad = i;
        INFO("first difference at " << first_bad);
        CHECK(first_bad == -1);

        // Back: every 16-bit pattern the CPU produced, and then any pattern at all.
        std::vector<uint16_t> patterns = want;
        for (int64_t i = 0; i < n; i += 3) patterns[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
        std::vector<float> back(static_cast<size_t>(n));
        cpu().from_half(format, n, patterns.data(), back.data());
        HalfArray gp(n);
        gpu().copy_to_device(gp.data(), patterns.data(), patterns.size() * 2);
        GpuArray gback(n);
        gpu().from_half(format, n, gp.data(), gback.data());
        const std::vector<float> gb = gback.host();
        CHECK(std::memcmp(gb.data(), back.data(), sizeof(float) * n) == 0);
      }
    }
  }
}

TEST_CASE("sum_of_squares_into leaves the CPU's sum on the device", "[wire]") {
  for (const int64_t n : kSizes) {
    std::vector<float> x = random_vector(n, 70 + n);
    GpuArray gx(x);
    models::DeviceBuffer out(gpu(), 2);
    gpu().sum_of_squares_into(n, gx.data(), reinterpret_cast<double*>(out.data()));
    double got = 0;
    gpu().copy_to_host(&got, out.data(), sizeof got);
    gpu().synchronize();
    const double want = cpu().sum_of_squares(n, x.data());
    CHECK(std::abs(got - want) <= 1e-12 * want);
    x[n / 2] = std::numeric_limits<float>::infinity();
    GpuArray gi(x);
    gpu().sum_of_squares_into(n, gi.data(), reinterpret_cast<double*>(out.data()));
    gpu().copy_to_host(&got, out.data(), sizeof got);
    gpu().synchronize();
    CHECK(!std::isfinite(got));
  }
}

TEST_CASE("the second stream waits for marks and the compute stream joins it", "[overlap]") {
  auto stream = gpu().make_stream();
  REQUIRE(stream);
  const int64_t n = int64_t(1) << 24;  // large enough that an unordered copy would catch the fill midway
  models::DeviceBuffer a(gpu(), n), b(gpu(), n);
  std::vector<float> h(static_cast<size_t>(n));
  for (int round = 0; round < 3; ++round) {
    const float value = 1.f + round;
    gpu().fill(n, value, a.data());
    stream->record(round);
    stream->wait(round);
    stream->copy_to_host(h.data(), a.data(), sizeof(float) * n);
    stream->synchronize();
    CHECK(h.front() == value);
    CHECK(h.back() == value);
    // The other way: the second stream writes, the compute stream reads after join_owner.
    stream->fill(n, -value, b.data());
    stream->join_owner();
    gpu().copy(n, b.data(), a.data());
    gpu().copy_to_host(h.data(), a.data(), sizeof(float) * n);
    gpu().synchronize();
    CHECK(h.front() == -value);
    CHECK(h.back() == -value);
  }
}

namespace {

struct Views {
  std::vector<models::ParamView> views;
  int64_t n = 0;
  Views() {
    for (int64_t size : {120001, 3001, 17, 250003}) {
      views.push_back({"t" + std::to_string(views.size()), n, models::Shape{size}});
      n += size;
    }
  }
};

// Four steps of dense sync; backward simulated (the gradient lands, then each tensor is reported
// final from the last). Returns every step's output and finish_early_sends' answer.
std::vector<std::vector<float>> dense_steps(comm::Communicator& comm, models::Backend& backend, comm::WireDType wire,
                                            bool overlap, const Views& v, std::vector<int>* nonfinite = nullptr) {
  comm::DenseSync sync(comm, v.n, 0.4, backend, wire, comm::DenseBuckets{0.1, overlap, &v.views});
  std::vector<std::vector<float>> out;
  std::vector<float> params(static_cast<size_t>(v.n), 0.f);
  models::DeviceBuffer grads(backend, v.n);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = random_vector(v.n, 900 + 10 * step + comm.rank(), -2.f, 2.f);
    for (int64_t i = 0; i < v.n; i += 11) g[i] *= 1e-6f;
    if (step == 2 && comm.rank() == comm.size() - 1) g[v.views[1].offset + 5] = std::nanf("");
    comm::SyncBuffers b{params.data(), grads.data(), v.n, nullptr, 0, &v.views};
    const bool early = sync.begin_step(b, step);
    copy_to_device(backend, g.data(), v.n, grads.data());
    for (size_t t = v.views.size(); t-- > 0;) sync.gradients_ready(v.views[t].offset);
    const int bad = early ? sync.finish_early_sends() : -1;
    if (nonfinite) nonfinite->push_back(bad);
    sync.reduce(b, step);
    out.emplace_back(static_cast<size_t>(v.n));
    copy_to_host(backend, grads.data(), v.n, out.back().data());
  }
  return out;
}

}  // namespace

TEST_CASE("dense sync on GPU buffers gives the CPU's bits, overlapped on a second stream or not", "[dense][overlap]") {
  comm::Communicator& world = comm::world();
  const Views v;
  for (const comm::WireDType wire : {comm::WireDType::kF32, comm::WireDType::kBF16, comm::WireDType::kF16}) {
    std::vector<int> host_bad;
    const auto want = dense_steps(world, cpu(), wire, true, v, &host_bad);
    for (const bool overlap : {false, true}) {
      INFO("wire " << comm::wire_dtype_name(wire) << (overlap ? ", overlapped" : ", after backward"));
      comm::StagedCommunicator staged(world, gpu());
      std::vector<int> bad;
      const auto got = dense_steps(staged, gpu(), wire, overlap, v, &bad);
      for (size_t s = 0; s < want.size(); ++s)
        CHECK(std::memcmp(got[s].data(), want[s].data(), sizeof(float) * v.n) == 0);
      if (overlap) CHECK(bad == host_bad);
    }
  }
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
