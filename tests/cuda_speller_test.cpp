// The CUDA backend's row and speller ops (Listen-Attend-Spell; backend.h, models/cuda/speller.cu and
// attention.cu) against the CPU backend's loops, op by op, forward and backward, on random inputs.
// Every output starts poisoned: NaN where the op must write, and (for ops that write part of a
// matrix or add into it) the same random values on both sides elsewhere, so an element left
// unwritten, or written where it must not be, shows as a mismatch. Lengths include 1 and the full
// length. FP32 on both sides: within 1e-5 of max(|cpu value|, the tensor's RMS); copies and token
// choices exactly.
//
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped), as
// cuda_backend_test does. The whole-model LAS comparison belongs with the model-level tests.
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/backend.h"
#include "models/cuda/cuda_backend.h"
#include "models/device_buffer.h"
#include "cuda_parity.h"

using namespace trainer::models;
using trainer::cuda_testing::cpu;
using trainer::cuda_testing::GpuArray;
using trainer::cuda_testing::gpu;
using trainer::cuda_testing::random_vector;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<int32_t> random_ints(int64_t n, int32_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(below));
  return v;
}

// A copy of host data on the GPU.
static_assert(sizeof(int32_t) == sizeof(float), "int32 in float storage");
struct GpuInts {
  DeviceBuffer buffer;
  int64_t n;
  explicit GpuInts(const std::vector<int32_t>& host) : buffer(gpu(), std::max<int64_t>(1, host.size())), n(host.size()) {
    if (n) gpu().copy_to_device(buffer.data(), host.data(), sizeof(int32_t) * n);
    gpu().synchronize();
  }
  int32_t* data() { return reinterpret_cast<int32_t*>(buffer.data()); }
  std::vector<int32_t> host() {
    std::vector<int32_t> h(static_cast<size_t>(n));
    if (n) gpu().copy_to_host(h.data(), buffer.data(), sizeof(int32_t) * n);
    gpu().synchronize();
    return h;
  }
};

// Element-wise within 1e-5 of max(|cpu|, rms) (tests/cuda_parity.h).
void require_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what,
                   double rel = 1e-5) {
  trainer::cuda_testing::require_close(want, got, what, rel);
}

std::vector<float> poisoned_block(int64_t rows, int64_t cols, int64_t ld, uint64_t seed) {
  std::vector<float> y = random_vector(rows * ld, seed);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) y[i * ld + j] = kNaN;
  return y;
}

}  // namespace

TEST_CASE("CUDA swap_axes matches the CPU: time-major <-> utterance-major and the pyramid's pairs", "[cuda][las]") {
  struct Case {
    int64_t outer, a, b, cols;
  };
  const Case cases[] = {{1, 3, 17, 6}, {1, 17, 3, 6}, {5, 2, 3, 8}, {5, 3, 2, 8}, {1, 1, 1, 1}, {4, 2, 1, 33}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    INFO("outer " << c.outer << ", a " << c.a << ", b " << c.b << ", cols " << c.cols);
    const int64_t n = c.outer * c.a * c.b * c.cols;
    auto x = random_vector(n, seed++);
    std::vector<float> y(n, kNaN);
    GpuArray gx(x), gy(y);
    cpu().swap_axes(c.outer, c.a, c.b, c.cols, x.data(), y.data());
    gpu().swap_axes(c.outer, c.a, c.b, c.cols, gx.data(), gy.data());
    require_close(y, gy.host(), "swap_axes", 0.0);
  }
}

TEST_CASE("CUDA copy_2d, gather_rows and scatter_rows match the CPU", "[cuda][las]") {
  {
    const int64_t rows = 9, cols = 5, ldx = 12, ldy = 7;
    auto x = random_vector(rows * ldx, 1);
    auto y = poisoned_block(rows, cols, ldy, 2);
    GpuArray gx(x), gy(y);
    cpu().copy_2d(rows, cols, x.data() + 3, ldx, y.data(), ldy);
    gpu().copy_2d(rows, cols, gx.data() + 3, ldx, gy.data(), ldy);
    require_close(y, gy.host(), "copy_2d", 0.0);
  }
  {
    const int64_t rows = 1, cols = 4;  // one row, both leading dimensions the row's length
    auto x = random_vector(cols, 3);
    std::vector<float> y(cols, kNaN);
    GpuArray gx(x), gy(y);
    cpu().copy_2d(rows, cols, x.data(), cols, y.data(), cols);
    gpu().copy_2d(rows, cols, gx.data(), cols, gy.data(), cols);
    require_close(y, gy.host(), "copy_2d (one row)", 0.0);
  }
  const int64_t src_rows = 11, cols = 33;
  auto x = random_vector(src_rows * cols, 4);
  {
    const std::vector<int32_t> index = {3, 0, 10, 3, 7, 7, 1};  // repeats allowed
    const int64_t count = static_cast<int64_t>(index.size());
    std::vector<float> y(count * cols, kNaN);
    GpuArray gx(x), gy(y);
    GpuInts gindex(index);
    cpu().gather_rows(count, cols, index.data(), x.data(), y.data());
    gpu().gather_rows(count, cols, gindex.data(), gx.data(), gy.data());
    require_close(y, gy.host(), "gather_rows", 0.0);
  }
  {
    const std::vector<int32_t> index = {4, 0, 10, 2, 7};  // distinct target rows of an {11, cols} y
    const int64_t count = static_cast<int64_t>(index.size());
    std::vector<float> packed(x.begin(), x.begin() + count * cols);
    std::vector<float> y = random_vector(src_rows * cols, 5);
    for (int32_t r : index) std::fill_n(y.begin() + r * cols, cols, kNaN);
    GpuArray gpacked(packed), gy(y);
    GpuInts gindex(index);
    cpu().scatter_rows(count, cols, index.data(), packed.data(), y.data());
    gpu().scatter_rows(count, cols, gindex.data(), gpacked.data(), gy.data());
    require_close(y, gy.host(), "scatter_rows", 0.0);
  }
}

TEST_CASE("CUDA embedding rows and their gradient match the CPU, repeated tokens included", "[cuda][las]") {
  const int64_t classes = 33, rows = 40, ldy = 300;
  for (int64_t dim : {int64_t(3), int64_t(256)}) {
    INFO("dim " << dim);
    auto table = random_vector(classes * dim, 1);
    auto tokens = random_ints(rows, classes, 2);  // 40 draws of 33: repeats
    tokens[5] = tokens[6] = tokens[30] = 0;
    tokens[7] = classes - 1;
    GpuInts gtokens(tokens);
    auto y = poisoned_block(rows, dim, ldy, 3);
    GpuArray gtable(table), gy(y);
    cpu().embedding_forward(rows, dim, tokens.data(), table.data(), y.data(), ldy);
    gpu().embedding_forward(rows, dim, gtokens.data(), gtable.data(), gy.data(), ldy);
    require_close(y, gy.host(), "embedding_forward", 0.0);

    // Added into an existing gradient, the rows' gradients dy {rows, ldy} (only dim columns read).
    auto dy = random_vector(rows * ldy, 4);
    auto dtable = random_vector(classes * dim, 5);
    GpuArray gdy(dy), gdtable(dtable);
    cpu().embedding_backward(rows, dim, tokens.data(), dy.data(), ldy, dtable.data());
    gpu().embedding_backward(rows, dim, gtokens.data(), gdy.data(), ldy, gdtable.data());
    require_close(dtable, gdtable.host(), "embedding_backward");
  }
}

TEST_CASE("CUDA select_tokens matches the CPU: argmax (first largest) where drawn, the truth elsewhere", "[cuda][las]") {
  const int64_t rows = 23, classes = 33;
  auto logits = random_vector(rows * classes, 1, -3.f, 3.f);
  // Row 4 has its largest value twice: the first one wins.
  logits[4 * classes + 9] = logits[4 * classes + 20] = 10.f;
  auto use_model = random_ints(rows, 2, 2);
  use_model[4] = 1;
  auto truth = random_ints(rows, classes, 3);
  GpuArray glogits(logits);
  GpuInts guse(use_model), gtruth(truth), gtokens(std::vector<int32_t>(rows, -7));
  std::vector<int32_t> tokens(rows, -7);
  cpu().select_tokens(rows, classes, logits.data(), use_model.data(), truth.data(), tokens.data());
  gpu().select_tokens(rows, classes, glogits.data(), guse.data(), gtruth.data(), gtokens.data());
  CHECK(tokens[4] == 9);
  CHECK(gtokens.host() == tokens);
  // In place (tokens = truth), as the model calls it.
  cpu().select_tokens(rows, classes, logits.data(), use_model.data(), truth.data(), truth.data());
  gpu().select_tokens(rows, classes, glogits.data(), guse.data(), gtruth.data(), gtruth.data());
  CHECK(truth == tokens);
  CHECK(gtruth.host() == tokens);
}

TEST_CASE("CUDA LSTM cell forward and backward match the CPU", "[cuda][las]") {
  for (int64_t rows : {int64_t(1), int64_t(6)})
    for (int64_t hidden : {int64_t(7), int64_t(640)}) {
      INFO(rows << " rows of " << hidden);
      const int64_t n = rows * hidden;
      auto gates = random_vector(4 * n, 1, -3.f, 3.f), c_prev = random_vector(n, 2, -2.f, 2.f);
      std::vector<float> c(n, kNaN), h(n, kNaN), tanh_c(n, kNaN);
      GpuArray ggates(gates), gc_prev(c_prev), gc(c), gh(h), gtanh(tanh_c);
      cpu().lstm_cell_forward(rows, hidden, gates.data(), c_prev.data(), c.data(), h.data(), tanh_c.data());
      gpu().lstm_cell_forward(rows, hidden, ggates.data(), gc_prev.data(), gc.data(), gh.data(), gtanh.data());
      require_close(gates, ggates.host(), "gate activations");
      require_close(c, gc.host(), "c");
      require_close(h, gh.host(), "h");
      require_close(tanh_c, gtanh.host(), "tanh(c)");

      // Backward from the CPU's forward records (the same inputs on both sides).
      auto dh = random_vector(n, 3), dc = random_vector(n, 4);
      std::vector<float> dgates(4 * n, kNaN);
      GpuArray gact(gates), gtanh_cpu(tanh_c), gdh(dh), gdc(dc), gdgates(dgates);
      cpu().lstm_cell_backward(rows, hidden, gates.data(), c_prev.data(), tanh_c.data(), dh.data(), dc.data(),
                               dgates.data());
      gpu().lstm_cell_backward(rows, hidden, gact.data(), gc_prev.data(), gtanh_cpu.data(), gdh.data(), gdc.data(),
                               gdgates.data());
      require_close(dgates, gdgates.host(), "dgates");
      require_close(dc, gdc.host(), "dc (of c_prev)");
    }
}

namespace {

// One attention case: `rows` queries over `utterances` utterances of up to `steps` steps, rows
// mapped to utterances by `row_utterance` (empty: the identity); the context written into a wider
// matrix at column `offset` of `ldc`.
void check_attention(int64_t steps, int64_t dim, int64_t cols, const std::vector<int32_t>& lengths,
                     const std::vector<int32_t>& row_utterance, int64_t rows, uint64_t seed) {
  const int64_t utterances = static_cast<int64_t>(lengths.size()), offset = 5, ldc = cols + 9;
  INFO(rows << " rows, steps " << steps << ", dim " << dim << ", cols " << cols
            << (row_utterance.empty() ? "" : ", mapped rows"));
  const int32_t* map = row_utterance.empty() ? nullptr : row_utterance.data();
  // Energies are dot products of `dim` terms, and alpha's relative error is their absolute one: at
  // A = 512 inputs in [0, 1] (energies near 128) the two summation orders alone differ by 1e-5 in
  // alpha (a host emulation of the kernels' order), so the inputs are centred and halved.
  auto query = random_vector(rows * dim, seed, -0.5f, 0.5f);
  auto keys = random_vector(utterances * steps * dim, seed + 1, -0.5f, 0.5f);
  auto values = random_vector(utterances * steps * cols, seed + 2);
  std::vector<float> alpha(rows * steps, kNaN);
  auto context = poisoned_block(rows, offset + cols, ldc, seed + 3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < offset; ++j) context[r * ldc + j] = 0.5f;  // before the block: left alone
  GpuArray gquery(query), gkeys(keys), gvalues(values), galpha(alpha), gcontext(context);
  cpu().attention_forward(rows, steps, dim, cols, lengths.data(), map, query.data(), keys.data(), values.data(),
                          alpha.data(), context.data() + offset, ldc);
  gpu().attention_forward(rows, steps, dim, cols, lengths.data(), map, gquery.data(), gkeys.data(), gvalues.data(),
                          galpha.data(), gcontext.data() + offset, ldc);
  require_close(alpha, galpha.host(), "alpha");
  require_close(context, gcontext.host(), "context");
  for (int64_t r = 0; r < rows; ++r) {  // the CPU's weights: zero past the length, summing to 1
    const int64_t len = lengths[map ? map[r] : r];
    double sum = 0;
    for (int64_t t = 0; t < steps; ++t) sum += alpha[r * steps + t];
    CHECK(std::fabs(sum - 1.0) < 1e-5);
    if (len < steps) CHECK(alpha[r * steps + len] == 0.f);
  }

  // Backward from the CPU's alpha.
  auto dcontext = random_vector(rows * cols, seed + 4);
  std::vector<float> denergy(rows * steps, kNaN), dquery(rows * dim, kNaN);
  GpuArray galpha_cpu(alpha), gdcontext(dcontext), gdenergy(denergy), gdquery(dquery);
  cpu().attention_backward(rows, steps, dim, cols, lengths.data(), map, keys.data(), values.data(), alpha.data(),
                           dcontext.data(), denergy.data(), dquery.data());
  gpu().attention_backward(rows, steps, dim, cols, lengths.data(), map, gkeys.data(), gvalues.data(),
                           galpha_cpu.data(), gdcontext.data(), gdenergy.data(), gdquery.data());
  require_close(denergy, gdenergy.host(), "denergy");
  require_close(dquery, gdquery.host(), "dquery");
}

}  // namespace

TEST_CASE("CUDA attention forward and backward match the CPU: lengths 1 to full, mapped rows", "[cuda][las]") {
  // Training: one row per utterance; lengths 1, full and between. Steps past the 8 warps of a block
  // and a dimension past a warp's 32 lanes; values wider than the block's 256 threads.
  check_attention(20, 70, 300, {1, 20, 13, 7}, {}, 4, 10);
  check_attention(3, 5, 6, {3, 1, 2}, {}, 3, 20);
  check_attention(1, 64, 32, {1, 1}, {}, 2, 30);
  // The an4 sizes (A 512, C 768) over a short listener output.
  check_attention(9, 512, 768, {9, 4}, {}, 2, 40);
  // Decoding: beams of 3 over 3 utterances (rows -> utterance r / 3), and an irregular map.
  check_attention(12, 40, 50, {12, 1, 6}, {0, 0, 0, 1, 1, 1, 2, 2, 2}, 9, 50);
  check_attention(12, 40, 50, {5, 12}, {1, 0, 1, 1, 0}, 5, 60);
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
