// What every CUDA-against-CPU test shares: the GPU (set by main; tests skip without one), random
// inputs, host<->GPU arrays, and the tolerance checks. FP32 on both sides (no TF32), so results agree
// to rounding; tolerances are relative to max(|cpu value|, the tensor's RMS), since a bare relative
// test fails on values that cancel to near zero.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/device_buffer.h"
#include "models/parameters.h"

namespace trainer::cuda_testing {

inline models::Backend*& the_gpu() {
  static models::Backend* gpu = nullptr;
  return gpu;
}
inline models::Backend& gpu() { return *the_gpu(); }
inline models::Backend& cpu() { return models::cpu_backend(); }

inline std::vector<float> random_vector(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// A copy of host data on the GPU.
struct GpuArray {
  models::DeviceBuffer buffer;
  int64_t n;
  explicit GpuArray(const std::vector<float>& host)
      : buffer(gpu(), std::max<int64_t>(1, static_cast<int64_t>(host.size()))), n(static_cast<int64_t>(host.size())) {
    if (n) copy_to_device(gpu(), host.data(), n, buffer.data());
  }
  // n floats of NaN: an output; what the op leaves unwritten stays NaN and fails require_close.
  explicit GpuArray(int64_t size) : buffer(gpu(), std::max<int64_t>(1, size)), n(size) {
    gpu().fill(std::max<int64_t>(1, n), std::numeric_limits<float>::quiet_NaN(), buffer.data());
  }
  float* data() { return buffer.data(); }
  std::vector<float> host() const {
    std::vector<float> h(static_cast<size_t>(n));
    if (n) copy_to_host(gpu(), buffer.data(), n, h.data());
    return h;
  }
};

// Every element within rel * max(|want|, rms(want)) (the RMS over want's finite values); a NaN on
// either side (an output never written) fails, since NaN compares false. Returns the largest error
// relative to that scale, which tests print on success too: the margin a GPU leaves.
inline double require_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what,
                            double rel = 1e-4) {
  INFO(what);
  REQUIRE(want.size() == got.size());
  double sq = 0;
  int64_t finite = 0;
  for (float w : want)
    if (std::isfinite(w)) sq += double(w) * w, ++finite;
  const double rms = finite ? std::sqrt(sq / finite) : 0.0;
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = std::max(std::fabs(double(want[i])), rms) + 1e-30;
    const double err = std::fabs(double(want[i]) - got[i]) / scale;
    if (!(err <= rel)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
    if (err > worst || std::isnan(err)) worst = err;
  }
  // Built in this scope: an INFO inside an if ends with the if, before the CHECK reports.
  std::ostringstream detail;
  detail.precision(9);
  if (bad)
    detail << bad << " mismatches, the first at " << first << ": cpu " << want[first] << ", cuda " << got[first]
           << " (rms " << rms << "); ";
  detail << "largest error relative to max(|cpu|, rms): " << worst;
  INFO(detail.str());
  CHECK(bad == 0);
  return worst;
}

// Relative L2 error of each parameter tensor (gradients or values), named in the failure message,
// with a floor of 1e-5 of the whole vector's norm: the bias of a convolution followed by batch norm
// has an exactly zero gradient in exact arithmetic, so both sides hold rounding noise there (CPU
// direct vs CPU Winograd differ by 150% on those, and by at most 2e-5 on every other vgg16 and
// resnet20 gradient: the margin under the 1e-4).
inline void require_views_close(const models::ParameterStore& store, const std::vector<float>& want,
                                const std::vector<float>& got, const std::string& what, double rel = 1e-4) {
  REQUIRE(want.size() == got.size());
  double total = 0;
  for (float w : want) total += double(w) * w;
  const double floor = 1e-5 * std::sqrt(total);
  for (const models::ParamView& v : store.views()) {
    double diff = 0, norm = 0;
    for (int64_t i = v.offset; i < v.offset + v.numel(); ++i) {
      diff += (double(want[i]) - got[i]) * (double(want[i]) - got[i]);
      norm += double(want[i]) * want[i];
    }
    INFO(what << " " << v.name << ": |cuda - cpu| " << std::sqrt(diff) << ", |cpu| " << std::sqrt(norm));
    CHECK(std::sqrt(diff) <= rel * std::sqrt(norm) + floor);
  }
}

inline std::vector<float> host_grads(models::ParameterStore& store) {
  std::vector<float> h(static_cast<size_t>(store.size()));
  copy_to_host(store.memory(), store.grads(), store.size(), h.data());
  return h;
}

// The suite's run of these tests against the emulated kernels (CUDA_EMULATION_QUICK, set by
// scripts/cuda_emulation/CMakeLists.txt): cases leave out their largest sizes, which are there for a
// GPU's large-grid paths and take minutes emulated; run.sh and a GPU run every size.
inline bool quick() { return std::getenv("CUDA_EMULATION_QUICK") != nullptr; }

// The test binary's main: the GPU, or exit 77 (ctest's skip) where there is none.
inline int run_cuda_tests(int argc, char** argv) {
  try {
    the_gpu() = &models::cuda::cuda_backend(0);
  } catch (const std::exception& e) {
    std::printf("skip: %s\n", e.what());
    return 77;
  }
  std::printf("%s\n", the_gpu()->describe().c_str());
  return Catch::Session().run(argc, argv);
}

}  // namespace trainer::cuda_testing
