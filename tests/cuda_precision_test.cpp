// runtime.precision = bf16 on the CUDA backend (models/cuda/cuda_backend.h, Precision::kBf16): the bf16
// copies round exactly as the CPU's (bf16.cu), each bf16 convolution and layer GEMM is within
// bf16's error bound of exact products (tests/bf16_bound.h; a convolution's outputs are rounded to
// bf16 once more, since cuDNN writes bf16), and a ResNet-20 training step in bf16 on the GPU stays
// near the fp32 step on the CPU (loss within 1e-2 relative, gradient cosine above 0.99).
//
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/cuda/kernels.h"
#include "models/device_buffer.h"
#include "models/float_bits.h"  // bits_of
#include "models/model.h"
#include "bf16_bound.h"
#include "cuda_parity.h"

using namespace trainer::models;
using namespace trainer::cuda_testing;
using namespace trainer::bf16_testing;

namespace {

// The GPU's backend made with runtime.precision = bf16 (gpu() is the fp32 one, on the same device
// and stream).
Backend& gpu_bf16() {
  BackendSettings settings;
  settings.precision = Precision::kBf16;
  return cuda::cuda_backend(0, settings);
}

}  // namespace

TEST_CASE("CUDA bf16 copies round to nearest even as the CPU's, keep NaN and widen exactly", "[cuda][precision]") {
  std::vector<float> x = random_vector(5000, 1, -3.f, 3.f);
  const float specials[] = {0.f, -0.f, 1.f, 1.00390625f /* 1 + 2^-8: a tie, stays 1 */,
                            1.01171875f /* 1 + 3 * 2^-8: a tie, rounds up to even */, 3.3895314e38f /* to inf */,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                            1e-40f, -1.5e-39f, std::numeric_limits<float>::max()};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(x.size());
  // A strided source: 3 rows of `cols` at leading dimension cols + 5 (the layer GEMM's operands).
  const int64_t cols = n / 3, ld = cols + 5;
  std::vector<float> strided(3 * ld, 7.f);
  for (int64_t r = 0; r < 3; ++r) std::memcpy(&strided[r * ld], &x[r * cols], sizeof(float) * cols);

  GpuArray gx(x), gstrided(strided), gwide(n);
  DeviceBuffer half(gpu(), n), half_2d(gpu(), n);  // room for n bf16 (twice over)
  auto* h = reinterpret_cast<uint16_t*>(half.data());
  auto* h2 = reinterpret_cast<uint16_t*>(half_2d.data());
  auto stream = static_cast<cudaStream_t>(gpu().stream_handle());
  REQUIRE(cuda::launch_to_bf16(n, gx.data(), h, stream) == cudaSuccess);
  REQUIRE(cuda::launch_to_bf16_2d(3, cols, gstrided.data(), ld, h2, stream) == cudaSuccess);
  REQUIRE(cuda::launch_from_bf16(n, h, gwide.data(), stream) == cudaSuccess);
  std::vector<uint16_t> got(n), got_2d(3 * cols);
  gpu().copy_to_host(got.data(), h, sizeof(uint16_t) * n);
  gpu().copy_to_host(got_2d.data(), h2, sizeof(uint16_t) * 3 * cols);
  const std::vector<float> wide = gwide.host();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t want = reference_bf16(x[i]);
    if (got[i] != want) ++bad;
    const float widened = reference_widen(want);
    if (bits_of(wide[i]) != bits_of(widened)) ++bad;
    if (i < 3 * cols && got_2d[i] != want) ++bad;
  }
  CHECK(bad == 0);
  CHECK(got[5000 + 3] == 0x3f80);  // the tie at 1 + 2^-8 stays at 1 (even)
  CHECK(got[5000 + 4] == 0x3f82);  // the tie at 1 + 3 * 2^-8 goes up to the even neighbour
}

// [native]: cuDNN's bf16 kernels (scripts/cuda_emulation runs the CPU's fp32 ones in their place).
TEST_CASE("CUDA bf16 convolutions are within bf16's error bound of exact products", "[cuda][precision][native]") {
  struct Case {
    const char* name;
    ConvGeometry g;
  };
  const Case cases[] = {
      {"3x3 16->16", {4, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, false}},
      {"3x3 stride 2 16->32", {4, 16, 8, 8, 32, 3, 3, 2, 2, 1, 1, false}},
      {"stem 3->16", {4, 3, 8, 8, 16, 3, 3, 1, 1, 1, 1, false}},
      {"1x1 stride 2 with bias", {4, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0, true}},
      {"5x3, odd channels, bias", {2, 6, 9, 7, 10, 5, 3, 1, 2, 2, 1, true}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const ConvGeometry& g = c.g;
    const int64_t N = g.batch, C = g.in_channels, H = g.in_h, W = g.in_w, K = g.out_channels;
    const int64_t P = g.out_h(), Q = g.out_w();
    const auto x = random_vector(N * C * H * W, 1), w = random_vector(K * C * g.kernel_h * g.kernel_w, 2);
    const auto b = random_vector(K, 3), dy = random_vector(N * K * P * Q, 4);
    const ExactConv exact = exact_conv(g, x, w, b, dy);

    // The GPU's activations are channels-last; the reference is NCHW.
    auto to_nhwc = [](const std::vector<float>& nchw, int64_t n, int64_t c, int64_t hw) {
      std::vector<float> out(nchw.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t p = 0; p < hw; ++p) out[(i * hw + p) * c + ch] = nchw[(i * c + ch) * hw + p];
      return out;
    };
    auto to_nchw = [](const std::vector<float>& nhwc, int64_t n, int64_t c, int64_t hw) {
      std::vector<float> out(nhwc.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t p = 0; p < hw; ++p) out[(i * c + ch) * hw + p] = nhwc[(i * hw + p) * c + ch];
      return out;
    };
    GpuArray gx(to_nhwc(x, N, C, H * W)), gw(w), gb(b), gdy(to_nhwc(dy, N, K, P * Q));
    GpuArray gy(N * K * P * Q), gdx(N * C * H * W), gdw(w.size()), gdb(K);
    auto op = gpu_bf16().make_conv(g);
    op->forward(gx.data(), gw.data(), g.bias ? gb.data() : nullptr, gy.data());
    op->backward_weights(gx.data(), gdy.data(), gdw.data(), g.bias ? gdb.data() : nullptr);
    op->backward_data(gdy.data(), gw.data(), gdx.data());
    check_within_bf16_bound("forward", to_nchw(gy.host(), N, K, P * Q), exact.y, /*rounded_output=*/true);
    check_within_bf16_bound("backward data", to_nchw(gdx.host(), N, C, H * W), exact.dx, true);
    check_within_bf16_bound("backward weights", gdw.host(), exact.dw, true);
  }
}

// [native]: cuBLAS's bf16 product (under the emulation the CPU's layer GEMM stands in).
TEST_CASE("CUDA bf16 layer GEMMs are within bf16's error bound of exact products", "[cuda][precision][native]") {
  for (const GemmCase& t : gemm_cases()) {
    INFO("trans_a " << t.ta << " trans_b " << t.tb << " m " << t.m << " n " << t.n << " k " << t.k);
    const auto a = random_vector(t.m * t.k, 5), b = random_vector(t.k * t.n, 6), c0 = random_vector(t.m * t.n, 7);
    GpuArray ga(a), gb(b), gc(c0);
    gpu_bf16().layer_gemm(t.ta, t.tb, t.m, t.n, t.k, t.alpha, ga.data(), t.lda(), gb.data(), t.ldb(), t.beta,
                          gc.data(), t.n);
    check_within_bf16_bound("layer_gemm", gc.host(), exact_gemm(t, a, b, c0));
  }
  // The fp32 backend's layer GEMM is cuBLAS's SGEMM, as gemm().
  const auto a = random_vector(8 * 64, 8), b = random_vector(64 * 8, 9);
  GpuArray ga(a), gb(b), plain(64), layer(64);
  gpu().gemm(false, false, 8, 8, 64, 1.f, ga.data(), 64, gb.data(), 8, 0.f, plain.data(), 8);
  gpu().layer_gemm(false, false, 8, 8, 64, 1.f, ga.data(), 64, gb.data(), 8, 0.f, layer.data(), 8);
  CHECK(plain.host() == layer.host());
}

TEST_CASE("A ResNet-20 training step in bf16 on the GPU matches fp32 on the CPU", "[cuda][precision][native]") {
  const int64_t batch = 16;
  const auto x = random_vector(batch * 3 * 32 * 32, 10, -2.f, 2.f);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % 10);

  auto cm = make_image_model({"resnet20", 10, 0.f}, cpu(), 3);
  const double loss32 = cm->forward(Tensor{const_cast<float*>(x.data()), {batch, 3, 32, 32}}, labels.data(),
                                    Mode::kTrain);
  cm->backward();
  const std::vector<float> g32 = host_grads(cm->parameters());

  auto gm = make_image_model({"resnet20", 10, 0.f}, gpu_bf16(), 3);
  GpuArray gx(x), glabels(batch);
  gpu().copy_to_device(glabels.data(), labels.data(), sizeof(int32_t) * batch);
  const double loss16 = gm->forward(Tensor{gx.data(), {batch, 3, 32, 32}},
                                    reinterpret_cast<const int32_t*>(glabels.data()), Mode::kTrain);
  gm->backward();
  const std::vector<float> g16 = host_grads(gm->parameters());

  check_bf16_step_close("resnet20 on the GPU", loss16, loss32, g16, g32, 0.99);
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
