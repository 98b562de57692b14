// The compressors on the GPU against the CPU. The sparse passes (models/cuda/sparse.cu,
// comm/sync/methods/sparse/sparse_passes.h): each backend op on random inputs (outputs poisoned with NaN first),
// exactly, since they are integer counts, compactions and single float adds (GaussianK's double sums
// to 1e-12); then each sparse method on the CUDA backend against the same method on the CPU over 12
// steps (a dense warmup of 2, exact and reused thresholds; and with sync.<method>.dgc, its velocity on the
// device): every output bit for bit and the saved state byte for byte. PowerSGD (models/cuda/low_rank.cu): Gram-Schmidt within float rounding (its
// double sums run in another order), subtract exactly, and whole PowerSGD steps within 1e-4.
// DiLoCo (the outer steps on the device): lerp exactly, and whole DiLoCo steps within float
// rounding. Under mpiexec (scripts/gpu_check.sh: P = 2, 3 sharing the GPU through staged MPI) the
// exchanges are real.
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <sstream>
#include <utility>

#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "comm/quantized_allreduce.h"
#include "comm/sync/registry.h"
#include "tests/cuda_parity.h"
#include "tests/method_keys.h"

using namespace trainer;
using namespace trainer::cuda_testing;

namespace {

// Values with exact zeros and many ties (multiples of 1/8), plus ordinary floats.
std::vector<float> gradient_like(int64_t n, uint64_t seed) {
  std::vector<float> v = random_vector(n, seed, -2.f, 2.f);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 11 == 0) v[i] = 0.f;
    if (i % 5 == 0) v[i] = std::round(v[i] * 8.f) / 8.f;
  }
  return v;
}

std::vector<int32_t> as_ints(const std::vector<float>& v, int64_t count) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  std::memcpy(out.data(), v.data(), sizeof(int32_t) * count);
  return out;
}

uint32_t key_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

const std::vector<int64_t> kSizes{1, 255, 4096, 4097, 70001};

}  // namespace

TEST_CASE("magnitude_histogram forms acc and counts digits exactly", "[sparse]") {
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const auto grad = gradient_like(n, 1 + n), residual = gradient_like(n, 2 + n);
    for (const bool fuse : {true, false}) {
      // A prefix taken from a real entry's key, so the masked rounds count something.
      const uint32_t key = key_of(grad[n / 2] + residual[n / 2]);
      for (const int shift : {24, 16, 0}) {
        const uint32_t mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        const uint32_t prefix = key & mask;
        for (const uint32_t min_key : {0u, 1u}) {
          std::vector<float> cpu_acc = residual;
          std::vector<int32_t> cpu_hist(256, -1);
          cpu().magnitude_histogram(n, fuse ? grad.data() : nullptr, cpu_acc.data(), min_key, mask, prefix, shift,
                                    cpu_hist.data());
          GpuArray g(grad), acc(residual), hist(256);
          gpu().magnitude_histogram(n, fuse ? g.data() : nullptr, acc.data(), min_key, mask, prefix, shift,
                                    reinterpret_cast<int32_t*>(hist.data()));
          CHECK(as_ints(hist.host(), 256) == cpu_hist);
          CHECK(acc.host() == cpu_acc);
        }
      }
    }
  }
}

TEST_CASE("select_at_least compacts in index order and reports the count", "[sparse]") {
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const auto grad = gradient_like(n, 3 + n), residual = gradient_like(n, 4 + n);
    for (const float t : {0.f, 1e-45f, 0.5f, 1.25f, 3.f, 10.f}) {
      INFO("t = " << t);
      std::vector<float> cpu_acc = residual, cpu_index(n + 1), cpu_value(n + 1);
      const int64_t want = cpu().select_at_least(n, grad.data(), cpu_acc.data(), t,
                                                 reinterpret_cast<int32_t*>(cpu_index.data()), cpu_value.data(), n);
      GpuArray g(grad), acc(residual), index(n), value(n);
      // No room first: the count only, acc formed.
      CHECK(gpu().select_at_least(n, g.data(), acc.data(), t, reinterpret_cast<int32_t*>(index.data()), value.data(),
                                  0) == want);
      CHECK(acc.host() == cpu_acc);
      const int64_t got = gpu().select_at_least(n, nullptr, acc.data(), t, reinterpret_cast<int32_t*>(index.data()),
                                                value.data(), n);
      REQUIRE(got == want);
      const auto gi = index.host(), gv = value.host();
      CHECK(std::memcmp(gi.data(), cpu_index.data(), sizeof(float) * want) == 0);
      CHECK(std::memcmp(gv.data(), cpu_value.data(), sizeof(float) * want) == 0);
    }
  }
}

TEST_CASE("accumulate_moments, sparse_to_dense and scatter_fill", "[sparse]") {
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const auto grad = gradient_like(n, 5 + n), residual = gradient_like(n, 6 + n);
    std::vector<float> cpu_acc = residual;
    double want[2], got[2];
    cpu().accumulate_moments(n, grad.data(), cpu_acc.data(), want);
    GpuArray g(grad), acc(residual);
    gpu().accumulate_moments(n, g.data(), acc.data(), got);
    CHECK(acc.host() == cpu_acc);
    CHECK(std::fabs(got[0] - want[0]) <= 1e-12 * (std::fabs(want[0]) + n));
    CHECK(std::fabs(got[1] - want[1]) <= 1e-12 * std::fabs(want[1]));

    // Every third index (distinct, sorted), values to divide.
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < n; i += 3) idx.push_back(static_cast<int32_t>(i));
    const auto count = static_cast<int64_t>(idx.size());
    std::vector<float> idx_slots(count);
    std::memcpy(idx_slots.data(), idx.data(), sizeof(int32_t) * count);
    const auto values = random_vector(count, 7 + n);
    std::vector<float> cpu_out(n, std::numeric_limits<float>::quiet_NaN());
    cpu().sparse_to_dense(n, count, idx.data(), values.data(), 3.f, cpu_out.data());
    GpuArray gidx(idx_slots), gvalues(values), out(n);
    gpu().sparse_to_dense(n, count, reinterpret_cast<int32_t*>(gidx.data()), gvalues.data(), 3.f, out.data());
    CHECK(out.host() == cpu_out);

    cpu().scatter_fill(count, idx.data(), 0.f, cpu_acc.data());
    gpu().scatter_fill(count, reinterpret_cast<int32_t*>(gidx.data()), 0.f, acc.data());
    CHECK(acc.host() == cpu_acc);
  }
}

TEST_CASE("momentum_correction (DGC's velocity) gives the CPU's bits", "[sparse][dgc]") {
  for (int64_t n : kSizes) {
    for (const bool nesterov : {false, true}) {
      INFO("n = " << n << (nesterov ? ", Nesterov" : ""));
      const auto grad = gradient_like(n, 11 + n), velocity = gradient_like(n, 12 + n);
      std::vector<float> cpu_u = velocity, cpu_g = grad;
      cpu().momentum_correction(n, 0.9f, nesterov, cpu_u.data(), cpu_g.data());
      GpuArray u(velocity), g(grad);
      gpu().momentum_correction(n, 0.9f, nesterov, u.data(), g.data());
      CHECK(u.host() == cpu_u);
      CHECK(g.host() == cpu_g);
    }
  }
}

// Each sparse op once at the paper's gradient size (n = 27,569,568, Ok-Top-k's density
// 0.02): grids of thousands of blocks, offsets past 2^24, the 64-bit block counts. Hidden ([.][large]:
// a few hundred MB on both sides and seconds of CPU reference), run by scripts/gpu_check.sh.
TEST_CASE("the sparse ops at 27.5M entries", "[.][large][sparse]") {
  const int64_t n = 27569568;
  const auto grad = gradient_like(n, 101), residual = gradient_like(n, 102);
  GpuArray g(grad);
  SECTION("magnitude_histogram") {
    std::vector<float> cpu_acc = residual;
    std::vector<int32_t> cpu_hist(256, -1);
    cpu().magnitude_histogram(n, grad.data(), cpu_acc.data(), 0u, 0u, 0u, 24, cpu_hist.data());
    GpuArray acc(residual), hist(256);
    gpu().magnitude_histogram(n, g.data(), acc.data(), 0u, 0u, 0u, 24, reinterpret_cast<int32_t*>(hist.data()));
    CHECK(as_ints(hist.host(), 256) == cpu_hist);
    CHECK(acc.host() == cpu_acc);
  }
  SECTION("select_at_least") {
    // |grad + residual| <= 4: 3.6 keeps a few percent, about Ok-Top-k's density.
    std::vector<float> cpu_acc = residual, cpu_index(n), cpu_value(n);
    const int64_t want = cpu().select_at_least(n, grad.data(), cpu_acc.data(), 3.6f,
                                               reinterpret_cast<int32_t*>(cpu_index.data()), cpu_value.data(), n);
    GpuArray acc(residual), index(n), value(n);
    const int64_t got = gpu().select_at_least(n, g.data(), acc.data(), 3.6f, reinterpret_cast<int32_t*>(index.data()),
                                              value.data(), n);
    REQUIRE(got == want);
    CHECK(want > 0);
    const auto gi = index.host(), gv = value.host();
    CHECK(std::memcmp(gi.data(), cpu_index.data(), sizeof(float) * want) == 0);
    CHECK(std::memcmp(gv.data(), cpu_value.data(), sizeof(float) * want) == 0);
    CHECK(acc.host() == cpu_acc);
  }
  SECTION("accumulate_moments, sparse_to_dense, scatter_fill") {
    std::vector<float> cpu_acc = residual;
    double want[2], got[2];
    cpu().accumulate_moments(n, grad.data(), cpu_acc.data(), want);
    GpuArray acc(residual);
    gpu().accumulate_moments(n, g.data(), acc.data(), got);
    CHECK(acc.host() == cpu_acc);
    CHECK(std::fabs(got[0] - want[0]) <= 1e-12 * (std::fabs(want[0]) + n));
    CHECK(std::fabs(got[1] - want[1]) <= 1e-12 * std::fabs(want[1]));
    // Every 50th index (density 0.02), the last entry included.
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < n; i += 50) idx.push_back(static_cast<int32_t>(i));
    idx.push_back(static_cast<int32_t>(n - 1));
    const auto count = static_cast<int64_t>(idx.size());
    std::vector<float> idx_slots(count);
    std::memcpy(idx_slots.data(), idx.data(), sizeof(int32_t) * count);
    const auto values = random_vector(count, 103);
    std::vector<float> cpu_out(n, std::numeric_limits<float>::quiet_NaN());
    cpu().sparse_to_dense(n, count, idx.data(), values.data(), 2.f, cpu_out.data());
    GpuArray gidx(idx_slots), gvalues(values), out(n);
    gpu().sparse_to_dense(n, count, reinterpret_cast<int32_t*>(gidx.data()), gvalues.data(), 2.f, out.data());
    CHECK(out.host() == cpu_out);
    cpu().scatter_fill(count, idx.data(), 0.f, cpu_acc.data());
    gpu().scatter_fill(count, reinterpret_cast<int32_t*>(gidx.data()), 0.f, acc.data());
    CHECK(acc.host() == cpu_acc);
  }
}

TEST_CASE("every sparse method on the GPU gives the CPU's outputs and state, bit for bit", "[sparse][methods]") {
  comm::Communicator& world = comm::world();
  constexpr int64_t n = 9001;
  constexpr int kSteps = 12;
  std::vector<const char*> methods{"oktopk", "topka", "gaussiank"};
  if ((world.size() & (world.size() - 1)) == 0) methods.push_back("gtopk");
  std::vector<std::pair<const char*, bool>> runs;  // each method without and with sync.<method>.dgc
  for (const char* name : methods)
    for (const bool dgc : {false, true}) runs.emplace_back(name, dgc);
  for (const auto& [name, dgc] : runs) {
    SECTION(std::string(name) + (dgc ? ", sync.dgc and a sparsity warm-up" : "")) {
      comm::SyncOptions o;
      o.method = name;
      testing::set_if_own(o, "density", 0.02);
      o.dense_warmup_steps = 2;
      if (dgc) {  // the velocity and the decay's on the device; no clipping (its norm sums in another order)
        testing::set_if_own(o, "dgc", true);
        testing::set_if_own(o, "density_warmup_steps", 8);
        o.recipe.momentum = 0.9;
        o.recipe.nesterov = true;
        o.recipe.coupled_weight_decay = 1e-3;
      }
      testing::set_if_own(o, "local_threshold_every", 3);
      testing::set_if_own(o, "global_threshold_every", 2);
      testing::set_if_own(o, "region_every", 4);
      auto host = comm::make_gradient_sync(o, world, n, nullptr);
      // Device buffers move over MPI through host staging (ranks may share the GPU); the methods'
      // own lists go over its host side.
      comm::StagedCommunicator staged(world, gpu());
      o.backend = &gpu();
      auto device = comm::make_gradient_sync(o, staged, n, nullptr);
      std::vector<float> params = gradient_like(n, 7);  // DGC's weight decay reads them
      GpuArray gparams(params), ggrads(n);
      for (int step = 0; step < kSteps; ++step) {
        INFO("step " << step);
        std::vector<float> grads = gradient_like(n, 100 * step + world.rank());
        copy_to_device(gpu(), grads.data(), n, ggrads.data());
        comm::SyncBuffers hb{params.data(), grads.data(), n, nullptr, 0, nullptr};
        comm::SyncBuffers db{gparams.data(), ggrads.data(), n, nullptr, 0, nullptr};
        host->reduce(hb, step);
        device->reduce(db, step);
        CHECK(ggrads.host() == grads);
      }
      std::ostringstream a, b;
      host->save(a);
      device->save(b);
      CHECK(a.str() == b.str());
    }
  }
}

TEST_CASE("orthonormalize_columns and subtract", "[powersgd]") {
  // Factors of several shapes in one batch, one of them rank deficient (a repeated column).
  const std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1}, {7, 2}, {300, 3}, {2000, 4}, {64, 4}};
  std::vector<std::vector<float>> host;
  for (size_t s = 0; s < shapes.size(); ++s) {
    host.push_back(random_vector(shapes[s].first * shapes[s].second, 40 + s));
    if (s == 4)
      for (int64_t i = 0; i < 64; ++i) host[s][i * 4 + 2] = host[s][i * 4 + 0];
  }
  std::vector<std::vector<float>> want = host;
  std::vector<models::TallMatrix> cpu_batch, gpu_batch;
  std::vector<GpuArray> on_gpu;
  for (size_t s = 0; s < shapes.size(); ++s) {
    cpu_batch.push_back({want[s].data(), shapes[s].first, shapes[s].second});
    on_gpu.emplace_back(host[s]);
  }
  for (size_t s = 0; s < shapes.size(); ++s) gpu_batch.push_back({on_gpu[s].data(), shapes[s].first, shapes[s].second});
  cpu().orthonormalize_columns(cpu_batch);
  gpu().orthonormalize_columns(gpu_batch);
  for (size_t s = 0; s < shapes.size(); ++s) require_close(want[s], on_gpu[s].host(), "factor " + std::to_string(s), 1e-5);

  const auto a = random_vector(5000, 50), b = random_vector(5000, 51);
  std::vector<float> y(5000);
  cpu().subtract(5000, a.data(), b.data(), y.data());
  GpuArray ga(a), gb(b), gy(5000);
  gpu().subtract(5000, ga.data(), gb.data(), gy.data());
  CHECK(gy.host() == y);
}

TEST_CASE("lerp gives the CPU's bits at every weight", "[diloco]") {
  const auto start = random_vector(70001, 60), end = random_vector(70001, 61);
  for (const float weight : {0.f, 0.25f, 0.4999f, 0.5f, 0.7f, 1.f}) {
    INFO("weight " << weight);
    std::vector<float> want = end;
    cpu().lerp(70001, start.data(), weight, want.data());
    GpuArray gstart(start), gy(end);
    gpu().lerp(70001, gstart.data(), weight, gy.data());
    CHECK(gy.host() == want);
  }
}

TEST_CASE("DiLoCo on the GPU follows the CPU", "[diloco][methods]") {
  // Two fragments with a delay and mixing, inline (the overlapped transfer is host code, the same on
  // either device): fp32 averages on the staged communicator, int8 on a host copy. The outer step is
  // the optimizer's kernel (fma order as the CPU's), so the parameters agree to float rounding.
  comm::Communicator& world = comm::world();
  std::vector<models::ParamView> views;
  int64_t n = 0;
  for (const models::Shape& shape : std::vector<models::Shape>{{64, 48}, {64}, {32, 16, 3, 3}, {10}}) {
    views.push_back({"t" + std::to_string(views.size()), n, shape});
    n += views.back().numel();
  }
  for (const auto dtype : {comm::OuterDType::kF32, comm::OuterDType::kInt8}) {
    SECTION(comm::outer_dtype_name(dtype)) {
      comm::SyncOptions o;
      o.method = "diloco";
      o.dense_warmup_steps = 1;
      o.set("period", 4);
      o.set("fragments", 2);
      o.set("sync_delay", 1);
      o.set("mixing", 0.5);
      o.set("outer_momentum", 0.5);
      o.set("outer_dtype", comm::outer_dtype_name(dtype));
      o.overlap = false;
      auto host = comm::make_gradient_sync(o, world, n, &views);
      comm::StagedCommunicator staged(world, gpu());
      o.backend = &gpu();
      auto device = comm::make_gradient_sync(o, staged, n, &views);
      std::vector<float> params = random_vector(n, 70), grads(n);
      GpuArray gparams(params), ggrads(n);
      for (int step = 0; step < 12; ++step) {
        grads = random_vector(n, 400 + 10 * step + world.rank());
        copy_to_device(gpu(), grads.data(), n, ggrads.data());
        comm::SyncBuffers hb{params.data(), grads.data(), n, nullptr, 0, &views};
        comm::SyncBuffers db{gparams.data(), ggrads.data(), n, nullptr, 0, &views};
        host->reduce(hb, step);
        device->reduce(db, step);
        // The inner step: the same SGD on both, from each side's own parameters.
        std::vector<float> device_params = gparams.host();
        for (int64_t i = 0; i < n; ++i) {
          params[i] -= 0.05f * grads[i];
          device_params[i] -= 0.05f * grads[i];
        }
        copy_to_device(gpu(), device_params.data(), n, gparams.data());
        host->after_step(hb, step);
        device->after_step(db, step);
        require_close(params, gparams.host(), "parameters after step " + std::to_string(step), 1e-5);
      }
    }
  }
}

TEST_CASE("PowerSGD on the GPU follows the CPU within float rounding", "[powersgd][methods]") {
  comm::Communicator& world = comm::world();
  std::vector<models::ParamView> views;
  int64_t n = 0;
  for (const models::Shape& shape : std::vector<models::Shape>{{64, 48}, {64}, {32, 16, 3, 3}, {64, 48}, {10}}) {
    views.push_back({"t" + std::to_string(views.size()), n, shape});
    n += views.back().numel();
  }
  for (const int64_t rank : {2, 4}) {
    SECTION("rank " + std::to_string(rank)) {
      comm::SyncOptions o;
      o.method = "powersgd";
      o.set("rank", rank);
      o.dense_warmup_steps = 1;
      o.bucket_mb = 0.02;
      auto host = comm::make_gradient_sync(o, world, n, &views);
      comm::StagedCommunicator staged(world, gpu());
      o.backend = &gpu();
      auto device = comm::make_gradient_sync(o, staged, n, &views);
      std::vector<float> params(n, 0.f);
      GpuArray gparams(params), ggrads(n);
      for (int step = 0; step < 8; ++step) {
        std::vector<float> grads = random_vector(n, 300 + 10 * step + world.rank());
        copy_to_device(gpu(), grads.data(), n, ggrads.data());
        comm::SyncBuffers hb{params.data(), grads.data(), n, nullptr, 0, &views};
        comm::SyncBuffers db{gparams.data(), ggrads.data(), n, nullptr, 0, &views};
        host->reduce(hb, step);
        device->reduce(db, step);
        require_close(grads, ggrads.host(), "output at step " + std::to_string(step), 1e-4);
      }
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
