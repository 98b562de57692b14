#include "models/cpu/speller_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "models/backend.h"

namespace trainer::models::cpu {
namespace {

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

}  // namespace

void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t i = 0; i < a; ++i)
        std::memcpy(y + ((o * b + j) * a + i) * cols, x + ((o * a + i) * b + j) * cols, cols * sizeof(float));
}

void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i) std::memcpy(y + i * ldy, x + i * ldx, cols * sizeof(float));
}

void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) {
  for (int64_t i = 0; i < count; ++i) std::memcpy(y + i * cols, x + int64_t{index[i]} * cols, cols * sizeof(float));
}

void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) {
  for (int64_t i = 0; i < count; ++i) std::memcpy(y + int64_t{index[i]} * cols, x + i * cols, cols * sizeof(float));
}

void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, table + int64_t{tokens[r]} * dim, dim * sizeof(float));
}

void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                        float* dtable) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dtable + int64_t{tokens[r]} * dim;
    for (int64_t k = 0; k < dim; ++k) row[k] += dy[r * ldy + k];
  }
}

void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                   const int32_t* truth, int32_t* tokens) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    tokens[r] = use_model[r] ? static_cast<int32_t>(std::max_element(z, z + classes) - z) : truth[r];
  }
}

// gates {rows, 4H} hold the pre-activations of i, f, g, o on entry and their activations on exit.
void lstm_cell_forward(int64_t rows, int64_t H, float* gates, const float* c_prev, float* c, float* h,
                       float* tanh_c) {
  for (int64_t r = 0; r < rows; ++r) {
    float* g = gates + r * 4 * H;
    for (int64_t k = 0; k < H; ++k) {
      const float i = sigmoid(g[k]), f = sigmoid(g[H + k]), cand = std::tanh(g[2 * H + k]),
                  o = sigmoid(g[3 * H + k]);
      g[k] = i, g[H + k] = f, g[2 * H + k] = cand, g[3 * H + k] = o;
      const float cell = f * c_prev[r * H + k] + i * cand;
      const float t = std::tanh(cell);
      c[r * H + k] = cell;
      tanh_c[r * H + k] = t;
      h[r * H + k] = o * t;
    }
  }
}

void lstm_cell_backward(int64_t rows, int64_t H, const float* gates, const float* c_prev, const float* tanh_c,
                        const float* dh, float* dc, float* dgates) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gates + r * 4 * H;
    float* d = dgates + r * 4 * H;
    for (int64_t k = 0; k < H; ++k) {
      const float i = g[k], f = g[H + k], cand = g[2 * H + k], o = g[3 * H + k];
      const float t = tanh_c[r * H + k], grad_h = dh[r * H + k];
      const float dcell = dc[r * H + k] + grad_h * o * (1.f - t * t);
      d[k] = dcell * cand * i * (1.f - i);
      d[H + k] = dcell * c_prev[r * H + k] * f * (1.f - f);
      d[2 * H + k] = dcell * i * (1.f - cand * cand);
      d[3 * H + k] = grad_h * t * o * (1.f - o);
      dc[r * H + k] = dcell * f;
    }
  }
}

void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                       const int32_t* row_utterance, const float* query, const float* keys, const float* values,
                       float* alpha, float* context, int64_t ldc) {
  Backend& blas = cpu_backend();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t u = row_utterance ? row_utterance[r] : r, len = lengths[u];
    float* a = alpha + r * steps;
    blas.gemm(false, false, len, 1, dim, 1.f, keys + u * steps * dim, dim, query + r * dim, 1, 0.f, a, 1);
    const float top = *std::max_element(a, a + len);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) sum += a[t] = std::exp(a[t] - top);
    for (int64_t t = 0; t < len; ++t) a[t] /= sum;
    std::fill(a + len, a + steps, 0.f);
    blas.gemm(true, false, cols, 1, len, 1.f, values + u * steps * cols, cols, a, 1, 0.f, context + r * ldc, 1);
  }
}

void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                        const int32_t* row_utterance, const float* keys, const float* values, const float* alpha,
                        const float* dcontext, float* denergy, float* dquery) {
  Backend& blas = cpu_backend();
  std::vector<float> dalpha(steps);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t u = row_utterance ? row_utterance[r] : r, len = lengths[u];
    const float* a = alpha + r * steps;
    blas.gemm(false, false, len, 1, cols, 1.f, values + u * steps * cols, cols, dcontext + r * cols, 1, 0.f,
              dalpha.data(), 1);
    float dot = 0.f;
    for (int64_t k = 0; k < len; ++k) dot += a[k] * dalpha[k];
    float* de = denergy + r * steps;
    for (int64_t k = 0; k < len; ++k) de[k] = a[k] * (dalpha[k] - dot);
    std::fill(de + len, de + steps, 0.f);
    blas.gemm(true, false, dim, 1, len, 1.f, keys + u * steps * dim, dim, de, 1, 0.f, dquery + r * dim, 1);
  }
}

}  // namespace trainer::models::cpu
