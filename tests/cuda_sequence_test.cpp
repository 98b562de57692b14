// The CUDA backend's sequence ops (models/cuda/sequence.cu, lookahead.cu, ctc.cu) against the CPU
// backend's loops: gather (masking, reversing, strided rows), packing, Hardtanh, the lookahead
// convolution, CTC, the image <-> sequence reorder, the width mask and the transpose, forward and
// backward, on random inputs. Batches mix a full-length utterance, a length-1 one and T = 1.
// Every output is poisoned with NaN before the call on both sides, so an element a kernel skips
// fails the comparison. Element-wise within 1e-5 of max(|cpu value|, the tensor's RMS) (FP32 on
// both sides; sums of a few products may round differently); CTC's losses within 1e-6 relative
// (double inside on both sides).
//
// Needs a GPU: without one the binary prints why and exits 77, which ctest reports as skipped.
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
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
using trainer::cuda_testing::quick;
using trainer::cuda_testing::random_vector;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> poisoned(int64_t n) { return std::vector<float>(static_cast<size_t>(n), kNaN); }

// Element-wise tolerance of these ops (tests/cuda_parity.h's check).
void require_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what,
                   double rel = 1e-5) {
  trainer::cuda_testing::require_close(want, got, what, rel);
}

std::string lengths_text(const std::vector<int32_t>& lengths) {
  std::string s;
  for (int32_t l : lengths) s += (s.empty() ? "" : ",") + std::to_string(l);
  return "{" + s + "}";
}

struct SequenceCase {
  int64_t steps, cols;
  std::vector<int32_t> lengths;  // one per sequence: the batch
};

// Lengths with a full-length sequence, a length-1 one, a zero and T = 1; cols past one block of
// threads; a batch of more than 65,535 rows (the packing kernels' grid wraps).
std::vector<SequenceCase> sequence_cases() {
  std::vector<SequenceCase> cases = {
      {5, 3, {5, 1, 3}}, {1, 7, {1, 1}}, {7, 37, {7, 2, 1, 6, 0}}, {9, 300, {4, 9, 1}}, {1, 1, {1}},
  };
  std::vector<int32_t> many(100);
  for (size_t n = 0; n < many.size(); ++n) many[n] = static_cast<int32_t>(n == 0 ? 700 : n == 1 ? 1 : (n * 37) % 700);
  if (!quick()) cases.push_back({700, 3, many});
  return cases;
}

}  // namespace

TEST_CASE("CUDA sequence_gather matches the CPU: masking, reversing, strided rows", "[cuda][sequence]") {
  uint64_t seed = 1;
  for (const SequenceCase& c : sequence_cases()) {
    const int64_t T = c.steps, N = c.lengths.size(), C = c.cols;
    for (bool reverse : {false, true}) {
      INFO("T " << T << ", cols " << C << ", lengths " << lengths_text(c.lengths) << ", reverse " << reverse);
      // Contiguous rows: every element of dst is written.
      auto src = random_vector(T * N * C, seed++);
      auto want = poisoned(T * N * C);
      cpu().sequence_gather(T, N, C, c.lengths.data(), reverse, src.data(), C, want.data(), C);
      GpuArray gsrc(src), gdst(T * N * C);
      gpu().sequence_gather(T, N, C, c.lengths.data(), reverse, gsrc.data(), C, gdst.data(), C);
      require_close(want, gdst.host(), "contiguous");

      // One direction of a bidirectional layer: the second half of rows of 2 * cols in and out;
      // the first half of dst keeps its values.
      auto wide = random_vector(T * N * 2 * C, seed++);
      auto background = random_vector(T * N * 2 * C, seed++);
      auto want2 = background;
      cpu().sequence_gather(T, N, C, c.lengths.data(), reverse, wide.data() + C, 2 * C, want2.data() + C, 2 * C);
      GpuArray gwide(wide), gdst2(background);
      gpu().sequence_gather(T, N, C, c.lengths.data(), reverse, gwide.data() + C, 2 * C, gdst2.data() + C, 2 * C);
      require_close(want2, gdst2.host(), "strided rows");
    }
  }
  // A reversed length past T would read rows that do not exist: refused before any launch.
  const std::vector<int32_t> too_long{3, 4};
  GpuArray a(3 * 2), b(3 * 2);
  CHECK_THROWS_WITH(gpu().sequence_gather(3, 2, 1, too_long.data(), true, a.data(), 1, b.data(), 1),
                    Catch::Contains("exceeds"));
}

TEST_CASE("CUDA pack_sequences and unpack_sequences match the CPU", "[cuda][sequence]") {
  uint64_t seed = 100;
  for (const SequenceCase& c : sequence_cases()) {
    const int64_t T = c.steps, N = c.lengths.size(), C = c.cols;
    const int64_t valid = std::accumulate(c.lengths.begin(), c.lengths.end(), int64_t(0));
    INFO("T " << T << ", cols " << C << ", lengths " << lengths_text(c.lengths));
    auto x = random_vector(T * N * C, seed++);
    auto packed = poisoned(valid * C);
    cpu().pack_sequences(T, N, C, c.lengths.data(), x.data(), packed.data());
    GpuArray gx(x), gpacked(valid * C);
    gpu().pack_sequences(T, N, C, c.lengths.data(), gx.data(), gpacked.data());
    require_close(packed, gpacked.host(), "pack");

    auto dense = random_vector(valid * C, seed++);
    auto unpacked = poisoned(T * N * C);
    cpu().unpack_sequences(T, N, C, c.lengths.data(), dense.data(), unpacked.data());
    GpuArray gdense(dense), gunpacked(T * N * C);
    gpu().unpack_sequences(T, N, C, c.lengths.data(), gdense.data(), gunpacked.data());
    require_close(unpacked, gunpacked.host(), "unpack");
  }
  // More sequences than a kernel parameter holds (host_ints.h): refused, not truncated.
  const std::vector<int32_t> lengths(1025, 1);
  GpuArray a(1025), b(1025);
  CHECK_THROWS_WITH(gpu().pack_sequences(1, 1025, 1, lengths.data(), a.data(), b.data()), Catch::Contains("1025"));
}

TEST_CASE("CUDA Hardtanh matches the CPU, forward and backward", "[cuda][sequence]") {
  // The last size needs more than 65,535 blocks of 256: the grid-stride loop wraps.
  for (int64_t n : {int64_t(1), int64_t(1000), quick() ? int64_t(70001) : (int64_t(1) << 24) + 3}) {
    INFO("n " << n);
    auto x = random_vector(n, 7, -30.f, 30.f), dy = random_vector(n, 8);
    x[0] = 0.f;  // exactly at lo: passes no gradient
    auto y = poisoned(n), dx = poisoned(n);
    cpu().hardtanh_forward(n, 0.f, 20.f, x.data(), y.data());
    cpu().hardtanh_backward(n, 0.f, 20.f, y.data(), dy.data(), dx.data());
    GpuArray gx(x), gdy(dy), gy(n), gdx(n);
    gpu().hardtanh_forward(n, 0.f, 20.f, gx.data(), gy.data());
    gpu().hardtanh_backward(n, 0.f, 20.f, gy.data(), gdy.data(), gdx.data());
    require_close(y, gy.host(), "forward", 0.0);
    require_close(dx, gdx.host(), "backward", 0.0);
  }
}

TEST_CASE("CUDA lookahead convolution matches the CPU: y, dx, dw", "[cuda][sequence]") {
  struct Case {
    int64_t steps, batch, channels, context;
  };
  // T = 1; context longer than T; a typical one; T * N over several row chunks of dw's reduction.
  const Case cases[] = {{1, 2, 5, 3}, {2, 3, 4, 3}, {9, 3, 40, 4}, {100, 5, 70, 20}, {300, 4, 33, 0}};
  uint64_t seed = 200;
  for (const Case& c : cases) {
    const int64_t T = c.steps, N = c.batch, C = c.channels, K = c.context + 1, n = T * N * C;
    INFO("T " << T << ", N " << N << ", C " << C << ", context " << c.context);
    auto x = random_vector(n, seed++), w = random_vector(C * K, seed++), dy = random_vector(n, seed++);
    auto y = poisoned(n), dx = poisoned(n), dw = poisoned(C * K);
    cpu().lookahead_forward(T, N, C, c.context, x.data(), w.data(), y.data());
    cpu().lookahead_backward(T, N, C, c.context, x.data(), w.data(), dy.data(), dx.data(), dw.data());
    GpuArray gx(x), gw(w), gdy(dy), gy(n), gdx(n), gdw(C * K);
    gpu().lookahead_forward(T, N, C, c.context, gx.data(), gw.data(), gy.data());
    gpu().lookahead_backward(T, N, C, c.context, gx.data(), gw.data(), gdy.data(), gdx.data(), gdw.data());
    require_close(y, gy.host(), "y");
    require_close(dx, gdx.host(), "dx");
    require_close(dw, gdw.host(), "dw");
    // dw sums in fixed chunks: the same bits on a second call.
    GpuArray gdw2(C * K);
    gpu().lookahead_backward(T, N, C, c.context, gx.data(), gw.data(), gdy.data(), gdx.data(), gdw2.data());
    CHECK(gdw.host() == gdw2.host());
  }
}

namespace {

struct CtcCase {
  int64_t steps, classes;
  std::vector<int32_t> frames;
  std::vector<std::vector<int32_t>> labels;  // per utterance
};

void check_ctc(const CtcCase& c, uint64_t seed) {
  const int64_t T = c.steps, N = c.frames.size(), C = c.classes;
  std::vector<int32_t> labels, lengths;
  for (const auto& l : c.labels) {
    labels.insert(labels.end(), l.begin(), l.end());
    lengths.push_back(static_cast<int32_t>(l.size()));
  }
  INFO("T " << T << ", classes " << C << ", frames " << lengths_text(c.frames) << ", label lengths "
            << lengths_text(lengths));
  const auto logits = random_vector(T * N * C, seed, -3.f, 3.f);
  const float scale = 1.f / static_cast<float>(N);
  std::vector<double> losses(N, std::nan("")), glosses(N, std::nan(""));
  auto dlogits = poisoned(T * N * C);
  cpu().ctc_loss(T, N, C, logits.data(), c.frames.data(), labels.data(), lengths.data(), scale, losses.data(),
                 dlogits.data());
  GpuArray glogits(logits), gd(T * N * C);
  gpu().ctc_loss(T, N, C, glogits.data(), c.frames.data(), labels.data(), lengths.data(), scale, glosses.data(),
                 gd.data());
  const std::vector<float> got = gd.host();
  for (int64_t n = 0; n < N; ++n) {
    INFO("utterance " << n);
    if (std::isinf(losses[n])) {
      CHECK(std::isinf(glosses[n]));
      CHECK(glosses[n] > 0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < C; ++k) {
          CHECK(dlogits[(t * N + n) * C + k] == 0.f);
          CHECK(got[(t * N + n) * C + k] == 0.f);
        }
    } else {
      CHECK(std::isfinite(losses[n]));
      CHECK(glosses[n] == Approx(losses[n]).epsilon(1e-6));
    }
  }
  require_close(dlogits, got, "dlogits");

  // Losses only (evaluation): the same values, the gradient buffer untouched.
  std::vector<double> eval(N, std::nan(""));
  gpu().ctc_loss(T, N, C, glogits.data(), c.frames.data(), labels.data(), lengths.data(), scale, eval.data(),
                 nullptr);
  for (int64_t n = 0; n < N; ++n) {
    if (std::isinf(losses[n])) CHECK(std::isinf(eval[n]));
    else CHECK(eval[n] == Approx(losses[n]).epsilon(1e-6));
  }
}

std::vector<int32_t> random_labels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(1, static_cast<int32_t>(classes - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("CUDA CTC loss matches the CPU: losses and dlogits, padding, empty labels, T = 1", "[cuda][ctc]") {
  // Full-length, a 1-frame utterance, repeats needing blanks, no labels.
  check_ctc({12, 6, {12, 1, 7, 12}, {{1, 2, 3}, {2}, {1, 1, 2, 2}, {}}}, 1);
  check_ctc({1, 5, {1, 1}, {{3}, {}}}, 2);
  check_ctc({4, 3, {4}, {{1, 2, 1, 2}}}, 3);  // exactly as many frames as labels
}

TEST_CASE("CUDA CTC loss: impossible alignments give +inf and a zero gradient, beside possible ones",
          "[cuda][ctc]") {
  // Impossible: "1 1" in two frames (it needs three: a blank between the repeats), four labels in
  // three frames, "1 1 1 1" in all six (it needs seven). Possible beside them: "2 2 2" in exactly the
  // five it needs, and two easy ones.
  check_ctc({6, 4, {2, 3, 6, 5, 6, 6}, {{1, 1}, {1, 2, 3, 1}, {1, 2}, {2, 2, 2}, {3, 3, 3}, {1, 1, 1, 1}}}, 4);
}

TEST_CASE("CUDA CTC loss: more states than a block's threads, AN4-sized", "[cuda][ctc]") {
  // 2L + 1 = 401 and 301 states over 256 threads; 29 classes as DeepSpeech's character set.
  CtcCase c{420, 29, {420, 400, 330}, {}};
  c.labels = {random_labels(200, 29, 5), random_labels(150, 29, 6), random_labels(60, 29, 7)};
  check_ctc(c, 8);
  // A batch of 32 with mixed lengths, as a training batch.
  CtcCase b{150, 29, {}, {}};
  for (int n = 0; n < 32; ++n) {
    const int32_t frames = n == 0 ? 150 : n == 1 ? 1 : 20 + (n * 13) % 130;
    b.frames.push_back(frames);
    b.labels.push_back(random_labels(n == 1 ? 1 : frames / 4, 29, 100 + n));
  }
  check_ctc(b, 9);
}

namespace {

// An {N, C, H, W} image from the same NCHW values on each side (none: NaN on both), in the CPU
// backend's own layout and in `gpu_layout` on the GPU.
struct ImagePair {
  Shape shape;
  std::vector<float> cpu_data;
  GpuArray gpu_data;
  Tensor cpu_tensor, gpu_tensor;
  ImagePair(const Shape& s, const std::vector<float>& nchw, Layout gpu_layout)
      : shape(s), cpu_data(poisoned(numel(s))), gpu_data(numel(s)) {
    cpu_tensor = Tensor{cpu_data.data(), shape, cpu().activation_layout(shape[1])};
    gpu_tensor = Tensor{gpu_data.data(), shape, gpu_layout};
    if (!nchw.empty()) {
      cpu().from_nchw(nchw.data(), cpu_tensor);
      GpuArray g(nchw);
      gpu().from_nchw(g.data(), gpu_tensor);
      gpu().synchronize();
    }
  }
  std::vector<float> cpu_nchw() {
    std::vector<float> v(cpu_data.size());
    cpu().to_nchw(cpu_tensor, v.data());
    return v;
  }
  std::vector<float> gpu_nchw() {
    GpuArray g(static_cast<int64_t>(cpu_data.size()));
    gpu().to_nchw(gpu_tensor, g.data());
    return g.host();
  }
};

struct ImageCase {
  Shape shape;
  Layout gpu_layout;
};

// Channels-last (the CUDA backend's own) and a blocked layout (element_offset's other branch).
std::vector<ImageCase> image_cases() {
  return {{{3, 16, 5, 7}, Layout::kChannelsLast}, {{3, 16, 5, 7}, Layout::kBlocked16},
          {{2, 8, 3, 4}, Layout::kBlocked8},      {{2, 3, 41, 9}, Layout::kChannelsLast},
          {{1, 1, 1, 1}, Layout::kChannelsLast},  {{4, 32, 11, 60}, Layout::kChannelsLast}};
}

}  // namespace

TEST_CASE("CUDA image_to_sequence and sequence_to_image match the CPU in every layout", "[cuda][sequence]") {
  uint64_t seed = 300;
  for (const ImageCase& c : image_cases()) {
    const int64_t N = c.shape[0], C = c.shape[1], H = c.shape[2], W = c.shape[3], n = N * C * H * W;
    INFO("image " << N << "x" << C << "x" << H << "x" << W << ", GPU layout " << layout_name(c.gpu_layout));
    ImagePair x(c.shape, random_vector(n, seed++), c.gpu_layout);
    auto seq = poisoned(n);
    cpu().image_to_sequence(x.cpu_tensor, seq.data());
    GpuArray gseq(n);
    gpu().image_to_sequence(x.gpu_tensor, gseq.data());
    require_close(seq, gseq.host(), "image_to_sequence", 0.0);

    auto back = random_vector(n, seed++);
    ImagePair y(c.shape, {}, c.gpu_layout);  // NaN on both sides
    cpu().sequence_to_image(back.data(), y.cpu_tensor);
    GpuArray gback(back);
    gpu().sequence_to_image(gback.data(), y.gpu_tensor);
    require_close(y.cpu_nchw(), y.gpu_nchw(), "sequence_to_image", 0.0);
  }
}

TEST_CASE("CUDA mask_width matches the CPU in every layout", "[cuda][sequence]") {
  uint64_t seed = 400;
  for (const ImageCase& c : image_cases()) {
    const int64_t N = c.shape[0], C = c.shape[1], H = c.shape[2], W = c.shape[3];
    // Full width, 1, 0, past the width, and a middle one, cycled over the batch.
    const int32_t pattern[] = {static_cast<int32_t>(W), 1, 0, static_cast<int32_t>(W + 5), static_cast<int32_t>(W / 2)};
    std::vector<int32_t> lengths(N);
    for (int64_t i = 0; i < N; ++i) lengths[i] = pattern[i % 5];
    INFO("image " << N << "x" << C << "x" << H << "x" << W << ", GPU layout " << layout_name(c.gpu_layout)
                  << ", lengths " << lengths_text(lengths));
    ImagePair x(c.shape, random_vector(N * C * H * W, seed++), c.gpu_layout);
    cpu().mask_width(x.cpu_tensor, lengths.data());
    gpu().mask_width(x.gpu_tensor, lengths.data());
    require_close(x.cpu_nchw(), x.gpu_nchw(), "mask_width", 0.0);
  }
}

TEST_CASE("CUDA transpose matches the CPU: partial tiles, one element, more tiles than blocks", "[cuda][sequence]") {
  struct Case {
    int64_t batch, rows, cols;
  };
  std::vector<Case> cases = {{1, 1, 1}, {3, 5, 7}, {2, 33, 65}, {4, 32, 32}, {2, 161, 300}, {1100, 2, 1900}};
  if (quick()) cases.resize(4);  // partial tiles, one element, whole tiles
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const int64_t n = c.batch * c.rows * c.cols;
    INFO("batch " << c.batch << ", " << c.rows << " x " << c.cols);
    auto x = random_vector(n, seed++);
    auto y = poisoned(n);
    cpu().transpose(c.batch, c.rows, c.cols, x.data(), y.data());
    GpuArray gx(x), gy(n);
    gpu().transpose(c.batch, c.rows, c.cols, gx.data(), gy.data());
    require_close(y, gy.host(), "transpose", 0.0);
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
