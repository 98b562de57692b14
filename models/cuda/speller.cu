// The speller's kernels of the CUDA backend (Listen-Attend-Spell; backend.h documents each op): LSTM
// cell gates, embedding rows by token id and their gradient, teacher forcing's token choice, rows
// gathered and scattered by an index list, and the axis swap that moves sequences between
// time-major and utterance-major and pairs the pyramid's frames. The arithmetic is the CPU loops'
// (models/cpu/speller_ops.cpp), element for element; nothing here sums across threads.
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// One thread per (row, unit): the unit's four gates, its cell and its output.
__global__ void lstm_cell_forward_kernel(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c,
                                         float* h, float* tanh_c) {
  const int64_t n = rows * hidden;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / hidden, k = i % hidden;
    float* g = gates + r * 4 * hidden;
    const float in = sigmoid(g[k]), f = sigmoid(g[hidden + k]), cand = tanhf(g[2 * hidden + k]),
                o = sigmoid(g[3 * hidden + k]);
    g[k] = in, g[hidden + k] = f, g[2 * hidden + k] = cand, g[3 * hidden + k] = o;
    const float cell = f * c_prev[i] + in * cand;
    const float t = tanhf(cell);
    c[i] = cell;
    tanh_c[i] = t;
    h[i] = o * t;
  }
}

__global__ void lstm_cell_backward_kernel(int64_t rows, int64_t hidden, const float* gates, const float* c_prev,
                                          const float* tanh_c, const float* dh, float* dc, float* dgates) {
  const int64_t n = rows * hidden;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / hidden, k = i % hidden;
    const float* g = gates + r * 4 * hidden;
    float* d = dgates + r * 4 * hidden;
    const float in = g[k], f = g[hidden + k], cand = g[2 * hidden + k], o = g[3 * hidden + k];
    const float t = tanh_c[i], grad_h = dh[i];
    const float dcell = dc[i] + grad_h * o * (1.f - t * t);
    d[k] = dcell * cand * in * (1.f - in);
    d[hidden + k] = dcell * c_prev[i] * f * (1.f - f);
    d[2 * hidden + k] = dcell * in * (1.f - cand * cand);
    d[3 * hidden + k] = grad_h * t * o * (1.f - o);
    dc[i] = dcell * f;
  }
}

__global__ void embedding_forward_kernel(int64_t rows, int64_t dim, const int32_t* tokens, const float* table,
                                         float* y, int64_t ldy) {
  const int64_t n = rows * dim;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / dim, k = i % dim;
    y[r * ldy + k] = table[static_cast<int64_t>(tokens[r]) * dim + k];
  }
}

// One thread per column walks the rows in order, so a token seen twice sums in row order, as on
// the CPU, and no two threads ever write the same element (no atomics, a deterministic result).
__global__ void embedding_backward_kernel(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy,
                                          int64_t ldy, float* dtable) {
  for (int64_t k = first_index(); k < dim; k += grid_stride())
    for (int64_t r = 0; r < rows; ++r) dtable[static_cast<int64_t>(tokens[r]) * dim + k] += dy[r * ldy + k];
}

// One thread per row: the argmax over a few dozen classes. tokens may be truth (same index only).
__global__ void select_tokens_kernel(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                                     const int32_t* truth, int32_t* tokens) {
  for (int64_t r = first_index(); r < rows; r += grid_stride()) {
    if (!use_model[r]) {
      tokens[r] = truth[r];
      continue;
    }
    const float* z = logits + r * classes;
    int64_t best = 0;  // the first largest, as std::max_element
    for (int64_t c = 1; c < classes; ++c)
      if (z[best] < z[c]) best = c;
    tokens[r] = static_cast<int32_t>(best);
  }
}

__global__ void gather_rows_kernel(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) {
  const int64_t n = count * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = x[static_cast<int64_t>(index[i / cols]) * cols + i % cols];
}

__global__ void scatter_rows_kernel(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) {
  const int64_t n = count * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[static_cast<int64_t>(index[i / cols]) * cols + i % cols] = x[i];
}

// One thread per element of y {outer, b, a, cols}, read from x {outer, a, b, cols}.
__global__ void swap_axes_kernel(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) {
  const int64_t n = outer * a * b * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t k = i % cols;
    int64_t rest = i / cols;
    const int64_t ia = rest % a;  // y's third index: x's second
    rest /= a;
    const int64_t ib = rest % b;  // y's second index: x's third
    const int64_t o = rest / b;
    y[i] = x[((o * a + ia) * b + ib) * cols + k];
  }
}

}  // namespace

cudaError_t launch_lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c,
                                     float* h, float* tanh_c, cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  lstm_cell_forward_kernel<<<grid_for(rows * hidden), kThreads, 0, stream>>>(rows, hidden, gates, c_prev, c, h,
                                                                             tanh_c);
  return cudaGetLastError();
}

cudaError_t launch_lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev,
                                      const float* tanh_c, const float* dh, float* dc, float* dgates,
                                      cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  lstm_cell_backward_kernel<<<grid_for(rows * hidden), kThreads, 0, stream>>>(rows, hidden, gates, c_prev, tanh_c,
                                                                              dh, dc, dgates);
  return cudaGetLastError();
}

cudaError_t launch_embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                                     int64_t ldy, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  embedding_forward_kernel<<<grid_for(rows * dim), kThreads, 0, stream>>>(rows, dim, tokens, table, y, ldy);
  return cudaGetLastError();
}

cudaError_t launch_embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                                      float* dtable, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  embedding_backward_kernel<<<grid_for(dim), kThreads, 0, stream>>>(rows, dim, tokens, dy, ldy, dtable);
  return cudaGetLastError();
}

cudaError_t launch_select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                                 const int32_t* truth, int32_t* tokens, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  select_tokens_kernel<<<grid_for(rows), kThreads, 0, stream>>>(rows, classes, logits, use_model, truth, tokens);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y,
                               cudaStream_t stream) {
  if (count <= 0 || cols <= 0) return cudaSuccess;
  gather_rows_kernel<<<grid_for(count * cols), kThreads, 0, stream>>>(count, cols, index, x, y);
  return cudaGetLastError();
}

cudaError_t launch_scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y,
                                cudaStream_t stream) {
  if (count <= 0 || cols <= 0) return cudaSuccess;
  scatter_rows_kernel<<<grid_for(count * cols), kThreads, 0, stream>>>(count, cols, index, x, y);
  return cudaGetLastError();
}

cudaError_t launch_swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y,
                             cudaStream_t stream) {
  const int64_t n = outer * a * b * cols;
  if (outer <= 0 || a <= 0 || b <= 0 || cols <= 0) return cudaSuccess;
  swap_axes_kernel<<<grid_for(n), kThreads, 0, stream>>>(outer, a, b, cols, x, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
