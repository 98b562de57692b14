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

#include <cmath>
#include <cstdint>
#include <cstdio>
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

void check_conv(ConvGeometry g, uint64_t seed) {
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
  auto d = gpu().make_conv(g);
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

TEST_CASE("CUDA batch norm matches the CPU: batch and frozen statistics, with and without fused ReLU", "[cuda]") {
  for (bool frozen : {false, true})
    for (bool relu : {false, true})
      for (int64_t hw : {int64_t(5), int64_t(1)}) {
        BatchNormGeometry g{4, 24, hw, hw, 1e-5f, relu, frozen, Layout::kChannelsLast};
        INFO("frozen " << frozen << ", relu " << relu << ", " << hw << "x" << hw);
        const int64_t n = g.batch * g.channels * g.h * g.w, C = g.channels;
        auto x = random_vector(n, 1, -2.f, 3.f), dy = random_vector(n, 2);
        auto gamma = random_vector(C, 3, 0.5f, 1.5f), beta = random_vector(C, 4, -0.5f, 0.5f);
        // Given statistics for frozen training and inference; batch statistics come out otherwise.
        auto mean = random_vector(C, 5, -0.5f, 0.5f), var = random_vector(C, 6, 0.5f, 2.f);
        std::vector<float> y(n), dx(n), dgamma(C), dbeta(C), yi(n);
        auto c = cpu().make_batchnorm(g);
        c->forward_training(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), var.data());
        c->backward(x.data(), dy.data(), gamma.data(), beta.data(), mean.data(), var.data(), dx.data(), dgamma.data(),
                    dbeta.data());
        c->forward_inference(x.data(), gamma.data(), beta.data(), mean.data(), var.data(), yi.data());

        GpuArray gx(x), gdy(dy), ggamma(gamma), gbeta(beta), gy(n), gdx(n), gdgamma(C), gdbeta(C), gyi(n);
        GpuArray gmean(frozen ? random_vector(C, 5, -0.5f, 0.5f) : std::vector<float>(C, 0.f));
        GpuArray gvar(frozen ? random_vector(C, 6, 0.5f, 2.f) : std::vector<float>(C, 0.f));
        auto d = gpu().make_batchnorm(g);
        d->forward_training(gx.data(), ggamma.data(), gbeta.data(), gy.data(), gmean.data(), gvar.data());
        d->backward(gx.data(), gdy.data(), ggamma.data(), gbeta.data(), gmean.data(), gvar.data(), gdx.data(),
                    gdgamma.data(), gdbeta.data());
        d->forward_inference(gx.data(), ggamma.data(), gbeta.data(), gmean.data(), gvar.data(), gyi.data());
        require_close(mean, gmean.host(), "batch mean");
        require_close(var, gvar.host(), "batch variance");
        require_close(y, gy.host(), "training forward");
        require_close(dx, gdx.host(), "dx");
        require_close(dgamma, gdgamma.host(), "dgamma");
        require_close(dbeta, gdbeta.host(), "dbeta");
        require_close(yi, gyi.host(), "inference forward");
      }
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
    for (bool first : {false, true}) {
      INFO("sgd nesterov " << nesterov << " first " << first);
      SgdUpdate u{-0.1f, 5e-4f, 1.f, 0.9f, true, first, nesterov};
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
  {
    AdamUpdate u{-1e-3f, std::sqrt(1 - 0.999f * 0.999f), 1e-8f, 0.9f, 0.1f, 0.999f, 1e-3f, 1e-2f, 1.f};
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
