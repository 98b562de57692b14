#include "models/cpu/sequence_ops.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "models/cpu/dnnl_context.h"

namespace trainer::models::cpu {
namespace {
// Below this many floats a loop runs on one thread: starting a parallel region costs more than
// the work, and far more when the cores are shared (a barrier waits out another process's turn).
constexpr int64_t kParallelMin = 1 << 15;
}  // namespace

void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                     const float* src, int64_t src_ld, float* dst, int64_t dst_ld) {
#pragma omp parallel for collapse(2) schedule(static) if(steps * batch * cols >= kParallelMin)
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t n = 0; n < batch; ++n) {
      float* out = dst + (t * batch + n) * dst_ld;
      if (t >= lengths[n]) {
        std::memset(out, 0, sizeof(float) * cols);
        continue;
      }
      const int64_t from = reverse ? lengths[n] - 1 - t : t;
      std::memcpy(out, src + (from * batch + n) * src_ld, sizeof(float) * cols);
    }
}

namespace {
// The packed row of every (t, n) of a padded batch, or -1 for padding.
std::vector<int64_t> packed_rows(int64_t steps, int64_t batch, const int32_t* lengths) {
  std::vector<int64_t> row(steps * batch);
  int64_t next = 0;
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t n = 0; n < batch; ++n) row[t * batch + n] = t < lengths[n] ? next++ : -1;
  return row;
}
}  // namespace

void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                    float* packed) {
  const std::vector<int64_t> row = packed_rows(steps, batch, lengths);
#pragma omp parallel for schedule(static) if(steps * batch * cols >= kParallelMin)
  for (int64_t i = 0; i < steps * batch; ++i)
    if (row[i] >= 0) std::memcpy(packed + row[i] * cols, x + i * cols, sizeof(float) * cols);
}

void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* packed,
                      float* x) {
  const std::vector<int64_t> row = packed_rows(steps, batch, lengths);
#pragma omp parallel for schedule(static) if(steps * batch * cols >= kParallelMin)
  for (int64_t i = 0; i < steps * batch; ++i) {
    if (row[i] >= 0) std::memcpy(x + i * cols, packed + row[i] * cols, sizeof(float) * cols);
    else std::memset(x + i * cols, 0, sizeof(float) * cols);
  }
}

void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y) {
#pragma omp parallel for simd schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(x[i], lo), hi);
}

void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) {
#pragma omp parallel for simd schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > lo && y[i] < hi ? dy[i] : 0.f;
}

void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                       const float* w, float* y) {
  // w is {C, K}; the inner loops want one tap across channels contiguous: wt {K, C}.
  const int64_t taps = context + 1;
  std::vector<float> wt(taps * channels);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k = 0; k < taps; ++k) wt[k * channels + c] = w[c * taps + k];
  const int64_t row = batch * channels;  // one time step
#pragma omp parallel for schedule(static) if(steps * batch * channels * taps >= kParallelMin)
  for (int64_t t = 0; t < steps; ++t) {
    float* out = y + t * row;
    std::fill(out, out + row, 0.f);
    for (int64_t k = 0; k < taps && t + k < steps; ++k) {
      const float* in = x + (t + k) * row;
      const float* wk = wt.data() + k * channels;
      for (int64_t n = 0; n < batch; ++n)
#pragma omp simd
        for (int64_t c = 0; c < channels; ++c) out[n * channels + c] += wk[c] * in[n * channels + c];
    }
  }
}

void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                        const float* w, const float* dy, float* dx, float* dw) {
  const int64_t taps = context + 1;
  std::vector<float> wt(taps * channels);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k = 0; k < taps; ++k) wt[k * channels + c] = w[c * taps + k];
  const int64_t row = batch * channels;
  // dx[s] = sum_k w[:, k] * dy[s - k]: the transpose of forward's sliding window.
#pragma omp parallel for schedule(static) if(steps * batch * channels * taps >= kParallelMin)
  for (int64_t s = 0; s < steps; ++s) {
    float* out = dx + s * row;
    std::fill(out, out + row, 0.f);
    for (int64_t k = 0; k < taps && k <= s; ++k) {
      const float* g = dy + (s - k) * row;
      const float* wk = wt.data() + k * channels;
      for (int64_t n = 0; n < batch; ++n)
#pragma omp simd
        for (int64_t c = 0; c < channels; ++c) out[n * channels + c] += wk[c] * g[n * channels + c];
    }
  }
  // dw[c, k] = sum_{t, n} dy[t, n, c] * x[t + k, n, c], summed in double (T*N terms per weight).
#pragma omp parallel for schedule(dynamic) if(steps * batch * channels * taps >= kParallelMin)
  for (int64_t k = 0; k < taps; ++k) {
    std::vector<double> acc(channels, 0.0);
    for (int64_t t = 0; t + k < steps; ++t) {
      const float* g = dy + t * row;
      const float* in = x + (t + k) * row;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t c = 0; c < channels; ++c)
          acc[c] += static_cast<double>(g[n * channels + c]) * in[n * channels + c];
    }
    for (int64_t c = 0; c < channels; ++c) dw[c * taps + k] = static_cast<float>(acc[c]);
  }
}

void image_sequence_reorder(const Tensor& image, float* sequence, bool to_sequence) {
  using dnnl::memory;
  const int64_t N = image.dim(0), C = image.dim(1), H = image.dim(2), W = image.dim(3);
  const memory::dims dims{N, C, H, W};
  // The sequence seen as an image with strides: element (n, c, h, w) at w*N*C*H + n*C*H + c*H + h.
  const memory::desc seq_md(dims, memory::data_type::f32, memory::dims{C * H, H, 1, N * C * H});
  memory img(activation_md(N, C, H, W, image.layout), dnnl_engine(), image.data);
  memory seq(seq_md, dnnl_engine(), sequence);
  if (to_sequence) dnnl::reorder(img, seq).execute(dnnl_stream(), img, seq);
  else dnnl::reorder(seq, img).execute(dnnl_stream(), seq, img);
  dnnl_stream().wait();
}

void mask_width(const Tensor& x, const int32_t* lengths) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  // Every layout keeps w outside a contiguous run of `inner` floats: (n, h) rows of W*C for
  // channels-last, (n, c/B, h) rows of W*B for B-blocked.
  const int64_t block = channel_block(x.layout);
  const int64_t inner = block ? block : C, rows_per_image = block ? (C / block) * H : H;
#pragma omp parallel for collapse(2) schedule(static) if(x.numel() >= kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t r = 0; r < rows_per_image; ++r) {
      const int64_t keep = std::min<int64_t>(std::max<int32_t>(lengths[n], 0), W);
      float* row = x.data + (n * rows_per_image + r) * W * inner;
      std::memset(row + keep * inner, 0, sizeof(float) * (W - keep) * inner);
    }
}

void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) {
  constexpr int64_t kTile = 32;
#pragma omp parallel for collapse(3) schedule(static) if(batch * rows * cols >= kParallelMin)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const float* in = x + b * rows * cols;
        float* out = y + b * rows * cols;
        for (int64_t j = j0; j < std::min(j0 + kTile, cols); ++j)
          for (int64_t i = i0; i < std::min(i0 + kTile, rows); ++i) out[j * rows + i] = in[i * cols + j];
      }
}

}  // namespace trainer::models::cpu
