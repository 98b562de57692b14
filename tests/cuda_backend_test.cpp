// The CUDA backend (models/cuda/) against the CPU backend: every op the image models use, forward
// and backward, on the same random inputs (both channels-last), and a full training step of
// resnet20 and vgg16. FP32 on both sides (no TF32), so results agree to rounding: element-wise
// within 1e-4 of max(|cpu value|, the tensor's RMS) (a bare relative test would fail on values that
// cancel to near zero), the full models per parameter tensor within 1e-4 relative L2 error.
//
// Needs a GPU: without one the binary prints why and exits 77, which ctest reports as skipped
// (CI and the build machine have the toolkit but no GPU). scripts/gpu_check.sh runs it on one.
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/device_buffer.h"
#include "models/model.h"
#include "cuda_parity.h"

using namespace trainer::models;
using namespace trainer::cuda_testing;

namespace {

void check_conv(ConvGeometry g, uint64_t seed, Backend& device = gpu()) {
  g.src_layout = g.dst_layout = Layout::kChannelsLast;
  INFO("conv " << g.batch << "x" << g.in_channels << "x" << g.in_h << "x" << g.in_w << " -> " << g.out_channels
               << " kernel " << g.kernel_h << "x" << g.kernel_w << " stride " << g.stride_h << "," << g.stride_w
               << " pad " << g.pad_h << "," << g.pad_w << " bias " << g.bias);
  const int64_t nx = g.batch * g.in_channels * g.in_h * g.in_w;
  const int64_t ny = g.batch * g.out_channels * g.out_h() * g.out_w();
  const int64_t nw = g.out_channels * g.in_channels * g.kernel_h * g.kernel_w;
  auto x = random_vector(nx, seed), w = random_vector(nw, seed + 1), b = random_vector(g.out_channels, seed + 2);
  auto dy = random_vector(ny, seed + 3);
  std::vector<float> y(ny), dx(nx), dw(nw), db(g.out_channels);
  auto c = cpu().make_conv(g);
  c->forward(x.data(), w.data(), g.bias ? b.data() : nullptr, y.data());
  c->backward_data(dy.data(), w.data(), dx.data());
  c->backward_weights(x.data(), dy.data(), dw.data(), g.bias ? db.data() : nullptr);

  GpuArray gx(x), gw(w), gb(b), gdy(dy), gy(ny), gdx(nx), gdw(nw), gdb(g.out_channels);
  auto d = device.make_conv(g);
  d->forward(gx.data(), gw.data(), g.bias ? gb.data() : nullptr, gy.data());
  d->backward_data(gdy.data(), gw.data(), gdx.data());
  d->backward_weights(gx.data(), gdy.data(), gdw.data(), g.bias ? gdb.data() : nullptr);
  require_close(y, gy.host(), "conv forward");
  require_close(dx, gdx.host(), "conv backward data");
  require_close(dw, gdw.host(), "conv backward weights");
  if (g.bias) require_close(db, gdb.host(), "conv backward bias");
}

}  // namespace

TEST_CASE("CUDA convolution matches the CPU: 3x3, stride 2, padding, 1x1, bias, non-square", "[cuda]") {
  check_conv({2, 3, 8, 8, 16, 3, 3, 1, 1, 1, 1, false}, 10);
  check_conv({2, 16, 9, 9, 32, 3, 3, 2, 2, 1, 1, true}, 20);
  check_conv({3, 8, 6, 6, 4, 1, 1, 1, 1, 0, 0, true}, 30);
  check_conv({2, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0, false}, 40);
  check_conv({2, 5, 7, 5, 6, 5, 3, 2, 1, 2, 1, true}, 50);
}

// The algorithm choice (models/cuda/cudnn_conv.cpp): under runtime.deterministic cuDNN's heuristics
// and no timed search at all (so two processes choose alike); otherwise one cudnnFind search per
// length class (length_class.h), whose algorithms later extents of the class reuse, and still match
// the CPU. DeepSpeech's first convolution (41x11, stride 2, padding 20x5) at a few time extents.
// [native]: cuDNN's, which scripts/cuda_emulation replaces with the CPU's convolutions.
TEST_CASE("CUDA convolution algorithms: none timed under runtime.deterministic, one search per length class",
          "[cuda][native]") {
  auto speech = [](int64_t width) { return ConvGeometry{2, 1, 41, width, 8, 41, 11, 2, 2, 20, 5, true}; };
  BackendSettings deterministic;
  deterministic.deterministic = true;
  Backend& gpu_deterministic = cuda::cuda_backend(0, deterministic);
  const int64_t before = cuda::convolution_searches();
  check_conv(speech(100), 60, gpu_deterministic);
  check_conv(speech(120), 61, gpu_deterministic);
  check_conv({2, 16, 9, 9, 32, 3, 3, 2, 2, 1, 1, true}, 62, gpu_deterministic);
  CHECK(cuda::convolution_searches() == before);
  // 100, 101, 105 and 110 lie in class 112; 120 and 128 in class 128 (four classes per octave).
  const int64_t searched = cuda::convolution_searches();
  uint64_t seed = 70;
  for (int64_t width : {100, 101, 105, 110, 120, 128}) check_conv(speech(width), seed++);
  CHECK(cuda::convolution_searches() - searched == 2);
}

namespace {

// What the batch norm tests feed an op: x drawn from [lo, hi), dy, gamma, beta, and the statistics
// that frozen training and inference take (means around x's).
struct BatchNormInputs {
  std::vector<float> x, dy, gamma, beta, mean, var;
  BatchNormInputs(const BatchNormGeometry& g, float lo, float hi)
      : x(random_vector(g.batch * g.channels * g.h * g.w, 1, lo, hi)),
        dy(random_vector(g.batch * g.channels * g.h * g.w, 2)),
        gamma(random_vector(g.channels, 3, 0.5f, 1.5f)),
        beta(random_vector(g.channels, 4, -0.5f, 0.5f)),
        mean(random_vector(g.channels, 5, (lo + hi) / 2 - 1.f, (lo + hi) / 2)),
        var(random_vector(g.channels, 6, 0.5f, 2.f)) {}
};

struct BatchNormResults {
  std::vector<float> mean, var, y, dx, dgamma, dbeta, yi;
};

// Training forward, backward and inference forward of one batch norm op. Frozen training and
// inference take the inputs' mean/var; otherwise the batch's come out.
BatchNormResults run_batchnorm(Backend& backend, const BatchNormGeometry& g, const BatchNormInputs& in) {
  const int64_t n = static_cast<int64_t>(in.x.size()), C = g.channels;
  auto upload = [&](const std::vector<float>& v) {
    DeviceBuffer b(backend, std::max<int64_t>(1, static_cast<int64_t>(v.size())));
    if (!v.empty()) copy_to_device(backend, v.data(), static_cast<int64_t>(v.size()), b.data());
    return b;
  };
  auto output = [&](int64_t size) {  // NaN: what the op leaves unwritten fails require_close
    DeviceBuffer b(backend, std::max<int64_t>(1, size));
    backend.fill(std::max<int64_t>(1, size), std::numeric_limits<float>::quiet_NaN(), b.data());
    return b;
  };
  auto download = [&](const DeviceBuffer& b, int64_t size) {
    std::vector<float> h(static_cast<size_t>(size));
    if (size) copy_to_host(backend, b.data(), size, h.data());
    return h;
  };
  DeviceBuffer x = upload(in.x), dy = upload(in.dy), gamma = upload(in.gamma), beta = upload(in.beta);
  DeviceBuffer mean = g.frozen_stats ? upload(in.mean) : output(C), var = g.frozen_stats ? upload(in.var) : output(C);
  DeviceBuffer y = output(n), dx = output(n), dgamma = output(C), dbeta = output(C), yi = output(n);
  auto op = backend.make_batchnorm(g);
  op->forward_training(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), var.data());
  op->backward(x.data(), dy.data(), gamma.data(), beta.data(), mean.data(), var.data(), dx.data(), dgamma.data(),
               dbeta.data());
  DeviceBuffer given_mean = upload(in.mean), given_var = upload(in.var);
  op->forward_inference(x.data(), gamma.data(), beta.data(), given_mean.data(), given_var.data(), yi.data());
  return {download(mean, C),   download(var, C),   download(y, n), download(dx, n),
          download(dgamma, C), download(dbeta, C), download(yi, n)};
}

// The header's formulas (models/cuda/batch_norm.cu) in double, with batch statistics and no ReLU.
BatchNormResults reference_batchnorm(const BatchNormGeometry& g, const BatchNormInputs& in) {
  const int64_t C = g.channels, M = static_cast<int64_t>(in.x.size()) / C;
  BatchNormResults r{std::vector<float>(C),           std::vector<float>(C), std::vector<float>(in.x.size()),
                     std::vector<float>(in.x.size()), std::vector<float>(C), std::vector<float>(C),
                     std::vector<float>(in.x.size())};
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, squares = 0, dbeta = 0, dgamma = 0;
    for (int64_t i = c; i < M * C; i += C) sum += in.x[i];
    const double mean = sum / M;
    for (int64_t i = c; i < M * C; i += C) squares += (in.x[i] - mean) * (in.x[i] - mean);
    const double var = squares / M, inv_std = 1 / std::sqrt(var + g.eps);
    const double given_inv_std = 1 / std::sqrt(double(in.var[c]) + g.eps);
    for (int64_t i = c; i < M * C; i += C) {
      dbeta += in.dy[i];
      dgamma += in.dy[i] * (in.x[i] - mean) * inv_std;
      r.y[i] = static_cast<float>(in.gamma[c] * (in.x[i] - mean) * inv_std + in.beta[c]);
      r.yi[i] = static_cast<float>(in.gamma[c] * (in.x[i] - double(in.mean[c])) * given_inv_std + in.beta[c]);
    }
    for (int64_t i = c; i < M * C; i += C)
      r.dx[i] =
          static_cast<float>(in.gamma[c] * inv_std * (in.dy[i] - dbeta / M - (in.x[i] - mean) * inv_std * dgamma / M));
    r.mean[c] = static_cast<float>(mean);
    r.var[c] = static_cast<float>(var);
    r.dgamma[c] = static_cast<float>(dgamma);
    r.dbeta[c] = static_cast<float>(dbeta);
  }
  return r;
}

// Every output of two runs within require_close's tolerance; returns the largest error on its scale.
double require_batchnorm_close(const BatchNormResults& want, const BatchNormResults& got) {
  return std::max({require_close(want.mean, got.mean, "batch mean"), require_close(want.var, got.var, "batch variance"),
                   require_close(want.y, got.y, "training forward"), require_close(want.dx, got.dx, "dx"),
                   require_close(want.dgamma, got.dgamma, "dgamma"), require_close(want.dbeta, got.dbeta, "dbeta"),
                   require_close(want.yi, got.yi, "inference forward")});
}

// The CUDA op against the CPU's.
double check_batchnorm(const BatchNormGeometry& g, float lo = -2.f, float hi = 3.f) {
  INFO("batch norm " << g.batch << "x" << g.channels << "x" << g.h << "x" << g.w << ", frozen " << g.frozen_stats
                     << ", relu " << g.fuse_relu << ", x in [" << lo << ", " << hi << ")");
  const BatchNormInputs in(g, lo, hi);
  return require_batchnorm_close(run_batchnorm(cpu(), g, in), run_batchnorm(gpu(), g, in));
}

// The CUDA op against double precision on x around 500 +- 1: a float E[x^2] - E[x]^2 keeps one
// digit of the variance there and a float running sum of x drifts by tens of ulps of the mean
// (so does the CPU's own oneDNN kernel: 60 ulps at 100 +- 1, hence double, not the CPU, here).
// y's tolerance then asks the mean to within about an ulp. Also: a second CUDA run gives the
// same bits (the partials combine in chunk order whichever block finishes last).
double check_batchnorm_offset(const BatchNormGeometry& g) {
  INFO("batch norm " << g.batch << "x" << g.channels << "x" << g.h << "x" << g.w << ", x in [499, 501)");
  const BatchNormInputs in(g, 499.f, 501.f);
  const BatchNormResults got = run_batchnorm(gpu(), g, in), again = run_batchnorm(gpu(), g, in);
  for (const auto& [a, b] :
       {std::pair(&got.mean, &again.mean), std::pair(&got.var, &again.var), std::pair(&got.y, &again.y),
        std::pair(&got.dx, &again.dx), std::pair(&got.dgamma, &again.dgamma), std::pair(&got.dbeta, &again.dbeta)})
    CHECK(std::memcmp(a->data(), b->data(), sizeof(float) * a->size()) == 0);
  return require_batchnorm_close(reference_batchnorm(g, in), got);
}

}  // namespace

TEST_CASE("CUDA batch norm matches the CPU: batch and frozen statistics, with and without fused ReLU", "[cuda]") {
  for (bool frozen : {false, true})
    for (bool relu : {false, true})
      for (int64_t hw : {int64_t(5), int64_t(1)})
        check_batchnorm({4, 24, hw, hw, 1e-5f, relu, frozen, Layout::kChannelsLast});
}

// The reductions where their structure matters: many row chunks combined by the last block, a large
// mean offset, channel groups (130 channels: three, the last narrower than its block) over a
// short last chunk. Sizes the emulation runs in seconds; ResNet-20's own is the [native] case below.
TEST_CASE("CUDA batch norm: a large mean offset, many row chunks, channel groups, the same bits every run", "[cuda]") {
  const double offset = check_batchnorm_offset({16, 16, 32, 32, 1e-5f, false, false, Layout::kChannelsLast});
  double groups = 0;
  for (bool frozen : {false, true})  // ReLU with given statistics only: no mask flips on rounding
    groups = std::max(groups, check_batchnorm({2, 130, 17, 19, 1e-5f, frozen, frozen, Layout::kChannelsLast}));
  // Printed on success too: what the tolerance (1e-4) leaves as margin.
  WARN("batch norm: largest relative error 16x16x32x32 around 500 (double reference) " << offset << ", 130 channels "
                                                                                       << groups);
}

// ResNet-20's first stage at batch 128 (M = 131072 rows, 512 row chunks). [native]: the emulation
// takes minutes at this size (each CUDA thread a std::thread); it passed there when written.
TEST_CASE("CUDA batch norm at ResNet-20's size: a large mean offset, the CPU, the same bits every run",
          "[cuda][native]") {
  const BatchNormGeometry g{128, 16, 32, 32, 1e-5f, false, false, Layout::kChannelsLast};
  const double offset = check_batchnorm_offset(g), cpu_error = check_batchnorm(g);
  WARN("batch norm: largest relative error 128x16x32x32 around 500 (double reference) "
       << offset << ", against the CPU " << cpu_error);
}

TEST_CASE("CUDA pooling matches the CPU: max, average excluding padding, global average", "[cuda]") {
  const PoolGeometry cases[] = {
      {2, 16, 8, 8, 3, 3, 2, 2, 1, 1, PoolKind::kMax, Layout::kChannelsLast},
      {2, 16, 8, 8, 2, 2, 2, 2, 0, 0, PoolKind::kMax, Layout::kChannelsLast},
      {2, 8, 7, 7, 3, 3, 1, 1, 1, 1, PoolKind::kAverage, Layout::kChannelsLast},
      {3, 32, 4, 4, 4, 4, 4, 4, 0, 0, PoolKind::kAverage, Layout::kChannelsLast},
  };
  uint64_t seed = 100;
  for (const PoolGeometry& g : cases) {
    INFO("pool kind " << int(g.kind) << " " << g.in_h << "x" << g.in_w << " kernel " << g.kernel_h << " stride "
                      << g.stride_h << " pad " << g.pad_h);
    const int64_t nx = g.batch * g.channels * g.in_h * g.in_w, ny = g.batch * g.channels * g.out_h() * g.out_w();
    auto x = random_vector(nx, seed++), dy = random_vector(ny, seed++);
    std::vector<float> y(ny), dx(nx), yi(ny);
    auto c = cpu().make_pool(g);
    c->forward(x.data(), yi.data(), false);
    c->forward(x.data(), y.data(), true);
    c->backward(dy.data(), dx.data());
    GpuArray gx(x), gdy(dy), gy(ny), gdx(nx), gyi(ny);
    auto d = gpu().make_pool(g);
    d->forward(gx.data(), gyi.data(), false);
    d->forward(gx.data(), gy.data(), true);
    d->backward(gdy.data(), gdx.data());
    require_close(yi, gyi.host(), "inference forward");
    require_close(y, gy.host(), "training forward");
    require_close(dx, gdx.host(), "backward");
  }
}

TEST_CASE("CUDA gemm matches the CPU for every transpose, leading dimensions and beta", "[cuda]") {
  const int64_t m = 7, n = 13, k = 29;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << ", trans_b " << tb);
      // Stored shapes: A is m x k (k x m when transposed), B is k x n (n x k); ld = columns + 3.
      const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = n + 3;
      auto a = random_vector(a_rows * lda, 1), b = random_vector(b_rows * ldb, 2), c = random_vector(m * ldc, 3);
      GpuArray ga(a), gb(b), gc(c);
      cpu().gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), ldc);
      gpu().gemm(ta, tb, m, n, k, 0.75f, ga.data(), lda, gb.data(), ldb, 0.5f, gc.data(), ldc);
      require_close(c, gc.host(), "gemm");
    }
}

TEST_CASE("CUDA element-wise ops, bias rows, shortcut and layouts match the CPU", "[cuda]") {
  const int64_t rows = 37, cols = 19, n = rows * cols;
  auto x = random_vector(n, 1), y0 = random_vector(n, 2), bias = random_vector(cols, 3);
  GpuArray gx(x), gy0(y0), gbias(bias);
  {
    std::vector<float> out(n), dx(n);
    GpuArray gout(n), gdx(n);
    cpu().relu_forward(n, x.data(), out.data());
    gpu().relu_forward(n, gx.data(), gout.data());
    require_close(out, gout.host(), "relu forward");
    cpu().relu_backward(n, out.data(), y0.data(), dx.data());
    gpu().relu_backward(n, gout.data(), gy0.data(), gdx.data());
    require_close(dx, gdx.host(), "relu backward");
    cpu().add(n, x.data(), y0.data(), out.data());
    gpu().add(n, gx.data(), gy0.data(), gout.data());
    require_close(out, gout.host(), "add");
    gpu().copy(n, gx.data(), gout.data());
    require_close(x, gout.host(), "copy");
    cpu().broadcast_rows(rows, cols, bias.data(), out.data());
    gpu().broadcast_rows(rows, cols, gbias.data(), gout.data());
    require_close(out, gout.host(), "broadcast_rows");
    std::vector<float> db(cols);
    GpuArray gdb(cols);
    cpu().sum_rows(rows, cols, x.data(), db.data());
    gpu().sum_rows(rows, cols, gx.data(), gdb.data());
    require_close(db, gdb.host(), "sum_rows");
    std::vector<float> s = x;
    cpu().scale(n, -0.3f, s.data());
    gpu().scale(n, -0.3f, gx.data());
    require_close(s, gx.host(), "scale");
    gpu().fill(n, 2.5f, gout.data());
    require_close(std::vector<float>(n, 2.5f), gout.host(), "fill");
  }
  for (int64_t hw : {int64_t(8), int64_t(7)}) {
    INFO("shortcut from " << hw << "x" << hw);
    const int64_t N = 2, C = 16, pad = 8, stride = 2, oh = (hw + 1) / 2;
    const int64_t nx = N * C * hw * hw, ny = N * (C + 2 * pad) * oh * oh;
    auto sx = random_vector(nx, 7), sdy = random_vector(ny, 8);
    std::vector<float> sy(ny), sdx(nx);
    Tensor cx{sx.data(), {N, C, hw, hw}}, cy{sy.data(), {N, C + 2 * pad, oh, oh}};
    Tensor cdy{sdy.data(), cy.shape}, cdx{sdx.data(), cx.shape};
    cpu().shortcut_a_forward(cx, stride, pad, cy);
    cpu().shortcut_a_backward(cdy, stride, pad, cdx);
    GpuArray gsx(sx), gsy(ny), gsdy(sdy), gsdx(nx);
    Tensor dx_{gsx.data(), cx.shape}, dy_{gsy.data(), cy.shape}, ddy{gsdy.data(), cy.shape}, ddx{gsdx.data(), cx.shape};
    gpu().shortcut_a_forward(dx_, stride, pad, dy_);
    gpu().shortcut_a_backward(ddy, stride, pad, ddx);
    require_close(sy, gsy.host(), "shortcut forward");
    require_close(sdx, gsdx.host(), "shortcut backward");

    std::vector<float> nchw(nx), back(nx);
    cpu().to_nchw(cx, nchw.data());
    GpuArray gnchw(nx), gback(nx);
    gpu().to_nchw(dx_, gnchw.data());
    require_close(nchw, gnchw.host(), "to_nchw");
    Tensor gb{gback.data(), cx.shape};
    gpu().from_nchw(gnchw.data(), gb);
    require_close(sx, gback.host(), "from_nchw undoes to_nchw");
  }
}

TEST_CASE("CUDA softmax cross-entropy matches the CPU: loss, gradient, correct count", "[cuda]") {
  const int64_t batch = 37, classes = 10;
  auto logits = random_vector(batch * classes, 1, -3.f, 3.f);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % classes);
  GpuArray glogits(logits), glabels(batch);
  gpu().copy_to_device(glabels.data(), labels.data(), sizeof(int32_t) * batch);
  for (float smoothing : {0.f, 0.1f}) {
    INFO("smoothing " << smoothing);
    std::vector<float> d(batch * classes);
    GpuArray gd(batch * classes);
    int64_t hits = -1, ghits = -2;
    const double loss = cpu().softmax_cross_entropy(batch, classes, logits.data(), labels.data(), smoothing,
                                                    d.data(), &hits);
    const double gloss = gpu().softmax_cross_entropy(batch, classes, glogits.data(),
                                                     reinterpret_cast<const int32_t*>(glabels.data()), smoothing,
                                                     gd.data(), &ghits);
    CHECK(gloss == Approx(loss).epsilon(1e-6));
    CHECK(ghits == hits);
    require_close(d, gd.host(), "dlogits");
    // Without a gradient buffer (evaluation).
    CHECK(gpu().softmax_cross_entropy(batch, classes, glogits.data(), reinterpret_cast<const int32_t*>(glabels.data()),
                                      smoothing, nullptr, nullptr) == Approx(loss).epsilon(1e-6));
  }
}

TEST_CASE("CUDA optimizer arithmetic matches the CPU: SGD, Adam, sum of squares, BN running statistics", "[cuda]") {
  const int64_t n = 100003;
  auto p = random_vector(n, 1), g = random_vector(n, 2), mom = random_vector(n, 3), v = random_vector(n, 4, 0.f, 1.f);
  for (bool nesterov : {false, true})
    for (bool first : {false, true})
      for (float scale : {1.f, 0.37f}) {  // 0.37: a binding clip's coefficient, applied in the update
        INFO("sgd nesterov " << nesterov << " first " << first << " grad_scale " << scale);
        SgdUpdate u{-0.1f, 5e-4f, 1.f, 0.9f, true, first, nesterov};
        u.grad_scale = scale;
        auto cp = p, cm = mom;
        cpu().sgd_update(n, u, cp.data(), g.data(), cm.data());
        GpuArray gp(p), gg(g), gm(mom);
        gpu().sgd_update(n, u, gp.data(), gg.data(), gm.data());
        require_close(cp, gp.host(), "sgd params", 1e-6);
        require_close(cm, gm.host(), "sgd momentum", 1e-6);
      }
  {
    SgdUpdate u{-0.05f, 0.f, 0.999f, 0.f, false, false, false};
    auto cp = p;
    cpu().sgd_update(n, u, cp.data(), g.data(), nullptr);
    GpuArray gp(p), gg(g);
    gpu().sgd_update(n, u, gp.data(), gg.data(), nullptr);
    require_close(cp, gp.host(), "sgd without momentum", 1e-6);
  }
  for (float scale : {1.f, 0.37f}) {
    INFO("adam grad_scale " << scale);
    AdamUpdate u{-1e-3f, std::sqrt(1 - 0.999f * 0.999f), 1e-8f, 0.9f, 0.1f, 0.999f, 1e-3f, 1e-2f, 1.f};
    u.grad_scale = scale;
    auto cp = p, cm = mom, cv = v;
    cpu().adam_update(n, u, cp.data(), g.data(), cm.data(), cv.data());
    GpuArray gp(p), gg(g), gm(mom), gv(v);
    gpu().adam_update(n, u, gp.data(), gg.data(), gm.data(), gv.data());
    require_close(cp, gp.host(), "adam params", 1e-6);
    require_close(cm, gm.host(), "adam m", 1e-6);
    require_close(cv, gv.host(), "adam v", 1e-6);
  }
  GpuArray gp(p);
  CHECK(gpu().sum_of_squares(n, gp.data()) == Approx(cpu().sum_of_squares(n, p.data())).epsilon(1e-12));
  CHECK(gpu().sum_of_squares(0, gp.data()) == 0.0);
  {
    const int64_t C = 40;
    auto bm = random_vector(C, 5), bv = random_vector(C, 6, 0.1f, 2.f), rm = random_vector(C, 7),
         rv = random_vector(C, 8, 0.5f, 1.5f);
    GpuArray gbm(bm), gbv(bv), grm(rm), grv(rv);
    cpu().batchnorm_update_running(C, 0.1f, 1.25f, bm.data(), bv.data(), rm.data(), rv.data());
    gpu().batchnorm_update_running(C, 0.1f, 1.25f, gbm.data(), gbv.data(), grm.data(), grv.data());
    require_close(rm, grm.host(), "running mean", 1e-6);
    require_close(rv, grv.host(), "running var", 1e-6);
  }
}

namespace {

void compare_training_step(const std::string& arch, int64_t batch) {
  INFO(arch << ", batch " << batch);
  auto cm = make_image_model({arch, 10, 0.f}, cpu(), 7);
  auto gm = make_image_model({arch, 10, 0.f}, gpu(), 7);
  REQUIRE(cm->parameters().host_values() == gm->parameters().host_values());  // the same initialization
  auto x = random_vector(batch * 3 * 32 * 32, 11, -2.f, 2.f);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((3 * i + 1) % 10);
  GpuArray gx(x), glabels(batch);
  gpu().copy_to_device(glabels.data(), labels.data(), sizeof(int32_t) * batch);
  const auto* gl = reinterpret_cast<const int32_t*>(glabels.data());

  int64_t hits = -1, ghits = -2;
  const double loss = cm->forward(Tensor{x.data(), {batch, 3, 32, 32}}, labels.data(), Mode::kTrain, &hits);
  const double gloss = gm->forward(Tensor{gx.data(), {batch, 3, 32, 32}}, gl, Mode::kTrain, &ghits);
  CHECK(gloss == Approx(loss).epsilon(1e-4));
  CHECK(ghits == hits);
  cm->backward();
  gm->backward();
  require_views_close(cm->parameters(), host_grads(cm->parameters()), host_grads(gm->parameters()), "gradient");
  // Running statistics after the training forward.
  require_views_close(cm->buffers(), cm->buffers().host_values(), gm->buffers().host_values(), "buffer");

  // One SGD step with momentum through each backend, then an evaluation forward on the new weights.
  const SgdUpdate u{-0.05f, 5e-4f, 1.f, 0.9f, true, true, false};
  DeviceBuffer cmom(cpu(), cm->parameters().size()), gmom(gpu(), gm->parameters().size());
  cpu().sgd_update(cm->parameters().size(), u, cm->parameters().values(), cm->parameters().grads(), cmom.data());
  gpu().sgd_update(gm->parameters().size(), u, gm->parameters().values(), gm->parameters().grads(), gmom.data());
  require_views_close(cm->parameters(), cm->parameters().host_values(), gm->parameters().host_values(), "after SGD");
  const double eval = cm->forward(Tensor{x.data(), {batch, 3, 32, 32}}, labels.data(), Mode::kEval, &hits);
  const double geval = gm->forward(Tensor{gx.data(), {batch, 3, 32, 32}}, gl, Mode::kEval, &ghits);
  CHECK(geval == Approx(eval).epsilon(1e-4));
  CHECK(ghits == hits);
}

}  // namespace

TEST_CASE("CUDA training step of resnet20 matches the CPU: loss, gradients, running statistics, update",
          "[cuda][model]") {
  compare_training_step("resnet20", 8);
}

TEST_CASE("CUDA training step of vgg16 matches the CPU (batch 4)", "[cuda][model]") {
  compare_training_step("vgg16", 4);
}

// [native]: not under scripts/cuda_emulation, whose layouts are the CPU convolutions'.
TEST_CASE("CUDA backend: describes itself and keeps activations channels-last", "[cuda][native]") {
  CHECK(gpu().activation_layout(16) == Layout::kChannelsLast);
  CHECK(gpu().name() == "cuda");
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
