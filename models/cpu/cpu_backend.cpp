// The CPU backend: oneDNN for convolution, batch norm and pooling; OpenBLAS (OpenMP build) for
// GEMM; plain OpenMP loops for the memory-bound element-wise ops, which is all they need.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/backend.h"
#include "models/bf16.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/cpu/dnnl_matmul.h"
#include "models/cpu/dnnl_precision.h"
#include "models/cpu/dnnl_ops.h"
#include "models/cpu/low_bit_ops.h"
#include "models/cpu/lstm_ops.h"
#include "models/cpu/optim_ops.h"
#include "models/cpu/sequence_ops.h"
#include "models/cpu/sync_ops.h"
#include "models/cpu/speller_ops.h"

namespace trainer::models {
namespace {

// Element (n, c, h, w) of a {N, C, H, W} activation in its layout.
inline int64_t offset(const Tensor& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t C = t.shape[1], H = t.shape[2], W = t.shape[3];
  if (const int64_t B = channel_block(t.layout)) return (((n * (C / B) + c / B) * H + h) * W + w) * B + c % B;
  return ((n * H + h) * W + w) * C + c;
}

// A bf16 tensor's 16-bit values (tensor.h: `data` is only the storage's pointer type).
inline uint16_t* halves(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data); }

void require_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype)
    throw std::logic_error(std::string(op) + ": a " + dtype_name(a.dtype) + " and a " + dtype_name(b.dtype) +
                           " tensor");
}

// y = a + b (then relu(y) when `relu`) on bf16 tensors, in fp32, rounded once.
void add_halves(const char* op, const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  require_same_dtype(op, a, y);
  require_same_dtype(op, b, y);
  const uint16_t *pa = halves(a), *pb = halves(b);
  uint16_t* py = halves(y);
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = widen_bf16(pa[i]) + widen_bf16(pb[i]);
    py[i] = round_to_bf16(relu && !(v > 0.f) ? 0.f : v);
  }
}

// The option-A shortcut's copy (backend.h) on either element type.
template <class T>
void shortcut_a_copy(const Tensor& x, const T* xs, int64_t stride, int64_t pad, const Tensor& y, T* ys) {
  const int64_t batch = y.dim(0), oc = y.dim(1), oh = y.dim(2), ow = y.dim(3), channels = x.dim(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t c = 0; c < oc; ++c) {
          const int64_t src = c - pad;
          ys[offset(y, n, c, i, j)] = src >= 0 && src < channels ? xs[offset(x, n, src, i * stride, j * stride)] : T(0);
        }
}

template <class T>
void shortcut_a_gradient(const Tensor& dy, const T* dys, int64_t stride, int64_t pad, const Tensor& dx, T* dxs) {
  const int64_t batch = dx.dim(0), channels = dx.dim(1), h = dx.dim(2), w = dx.dim(3);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        for (int64_t c = 0; c < channels; ++c)
          dxs[offset(dx, n, c, i, j)] =
              i % stride == 0 && j % stride == 0 ? dys[offset(dy, n, c + pad, i / stride, j / stride)] : T(0);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendSettings& settings) : settings_(settings) {
    cpu::require_precision(settings.precision);
  }
  const BackendSettings& settings() const { return settings_; }
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }

  // Memory is host memory and the stream is the calling thread: host_memory.cpp.
  void* allocate(size_t bytes) override { return host_memory().allocate(bytes); }
  void free(void* p) override { host_memory().free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    host_memory().copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { host_memory().copy_to_host(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { host_memory().fill(n, value, y); }
  void synchronize() override {}

  std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) override { return cpu::make_dnnl_conv(g, settings_); }
  std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) override {
    return cpu::make_dnnl_batchnorm(g);
  }
  std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) override { return cpu::make_dnnl_pool(g); }
  std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g) override {
    return cpu::make_lstm(g, settings_);
  }

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    // A few rows against a large matrix (the LAS speller's per-step cells, a small batch through a
    // Linear): OpenBLAS repacks the whole large operand on every call, which cost more than the
    // product; oneDNN's sgemm multiplies it in place (2-3.5x faster at 8 rows; the LAS training
    // step 5-9% faster).
    if (std::min(m, n) <= kFewRows && k * std::max(m, n) >= kLargeOperand) {
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }
  static constexpr int64_t kFewRows = 32, kLargeOperand = 1 << 16;

  void layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    layer_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, false);
  }
  void layer_gemm_weight(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    layer_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, true);
  }
  void weights_changed() override {
    if (settings_.precision == Precision::kBf16) cpu::bf16_weights_changed();
  }

  void broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) std::memcpy(y + i * cols, bias, sizeof(float) * cols);
  }

  void sum_rows(int64_t rows, int64_t cols, const float* dy, float* db) override {
    // Sum in double so the result does not depend on the batch size's rounding.
    std::vector<double> acc(cols, 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) acc[j] += dy[i * cols + j];
    for (int64_t j = 0; j < cols; ++j) db[j] = static_cast<float>(acc[j]);
  }

  void relu_forward(int64_t n, const float* x, float* y) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  }

  void relu_backward(int64_t n, const float* y, const float* dy, float* dx) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
  }

  void add(int64_t n, const float* a, const float* b, float* y) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }

  void copy(int64_t n, const float* x, float* y) override {
    if (x != y) std::memcpy(y, x, sizeof(float) * n);
  }

  Layout activation_layout(int64_t channels) const override {
    return cpu::dnnl_activation_layout(channels, settings_.precision);
  }

  void shortcut_a_forward(const Tensor& x, int64_t stride, int64_t pad, Tensor& y) override {
    require_same_dtype("shortcut_a_forward", x, y);
    if (x.dtype == DType::kBf16) shortcut_a_copy(x, halves(x), stride, pad, y, halves(y));
    else shortcut_a_copy(x, x.data, stride, pad, y, y.data);
  }

  void shortcut_a_backward(const Tensor& dy, int64_t stride, int64_t pad, Tensor& dx) override {
    require_same_dtype("shortcut_a_backward", dy, dx);
    if (dy.dtype == DType::kBf16) shortcut_a_gradient(dy, halves(dy), stride, pad, dx, halves(dx));
    else shortcut_a_gradient(dy, dy.data, stride, pad, dx, dx.data);
  }

  // The residual block's ops: fp32 tensors through the fp32 loops above (bit for bit what fp32 runs
  // always computed); bf16 widened, computed in fp32, rounded once.
  bool bf16_activations() const override { return settings_.precision == Precision::kBf16; }

  void add_relu_tensors(const Tensor& a, const Tensor& b, Tensor& y) override {
    if (y.dtype == DType::kF32) return Backend::add_relu_tensors(a, b, y);
    add_halves("add_relu_tensors", a, b, y, /*relu=*/true);
  }

  void relu_backward_tensors(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    if (dx.dtype == DType::kF32) return Backend::relu_backward_tensors(y, dy, dx);
    require_same_dtype("relu_backward_tensors", y, dx);
    require_same_dtype("relu_backward_tensors", dy, dx);
    const uint16_t *py = halves(y), *pdy = halves(dy);
    uint16_t* pdx = halves(dx);
    const int64_t n = dx.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pdx[i] = widen_bf16(py[i]) > 0.f ? pdy[i] : uint16_t(0);
  }

  void add_tensors(const Tensor& a, const Tensor& b, Tensor& y) override {
    if (y.dtype == DType::kF32) return Backend::add_tensors(a, b, y);
    add_halves("add_tensors", a, b, y, /*relu=*/false);
  }

  void convert_layout(const Tensor& x, Tensor& y) override { cpu::reorder_layout(x, y); }
  void to_nchw(const Tensor& x, float* y) override { cpu::reorder_nchw(x, y, true); }
  void from_nchw(const float* x, Tensor& y) override { cpu::reorder_nchw(y, const_cast<float*>(x), false); }

  double softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits, const int32_t* labels,
                               float smoothing, float* dlogits, int64_t* correct) override {
    double loss = 0.0;
    int64_t hits = 0;
    const double off = smoothing / classes, on = 1.0 - smoothing + off;
#pragma omp parallel for reduction(+ : loss, hits) schedule(static)
    for (int64_t i = 0; i < batch; ++i) {
      const float* z = logits + i * classes;
      const int64_t argmax = std::max_element(z, z + classes) - z;
      const double zmax = z[argmax];
      double sum = 0.0, sum_z = 0.0;
      for (int64_t c = 0; c < classes; ++c) {
        sum += std::exp(z[c] - zmax);
        sum_z += z[c];
      }
      const double log_sum = zmax + std::log(sum);
      // -sum_c target_c * log_softmax_c, with target = off everywhere plus (on - off) at the label.
      loss += -(off * (sum_z - classes * log_sum) + (on - off) * (z[labels[i]] - log_sum));
      hits += argmax == labels[i];
      if (dlogits) {
        float* d = dlogits + i * classes;
        for (int64_t c = 0; c < classes; ++c) {
          const double p = std::exp(z[c] - log_sum);
          d[c] = static_cast<float>((p - off - (c == labels[i] ? on - off : 0.0)) / batch);
        }
      }
    }
    if (correct) *correct = hits;
    return loss / batch;
  }

  // Sequence ops (speech models): loops in sequence_ops.cpp and ctc.cpp.
  void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                       const float* src, int64_t src_ld, float* dst, int64_t dst_ld) override {
    cpu::sequence_gather(steps, batch, cols, lengths, reverse, src, src_ld, dst, dst_ld);
  }
  void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                      float* packed) override {
    cpu::pack_sequences(steps, batch, cols, lengths, x, packed);
  }
  void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* packed,
                        float* x) override {
    cpu::unpack_sequences(steps, batch, cols, lengths, packed, x);
  }
  void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y) override {
    cpu::hardtanh_forward(n, lo, hi, x, y);
  }
  void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) override {
    cpu::hardtanh_backward(n, lo, hi, y, dy, dx);
  }
  void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                         const float* w, float* y) override {
    cpu::lookahead_forward(steps, batch, channels, context, x, w, y);
  }
  void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                          const float* w, const float* dy, float* dx, float* dw) override {
    cpu::lookahead_backward(steps, batch, channels, context, x, w, dy, dx, dw);
  }
  void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
                const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
                float* dlogits) override {
    cpu::ctc_loss(steps, batch, classes, logits, frames, labels, label_lengths, grad_scale, losses, dlogits);
  }
  void image_to_sequence(const Tensor& x, float* y) override { cpu::image_sequence_reorder(x, y, true); }
  void sequence_to_image(const float* y, Tensor& x) override {
    cpu::image_sequence_reorder(x, const_cast<float*>(y), false);
  }
  void mask_width(const Tensor& x, const int32_t* lengths) override { cpu::mask_width(x, lengths); }
  void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) override {
    cpu::transpose(batch, rows, cols, x, y);
  }

  // Rows and the attention speller (LAS): speller_ops.cpp.
  void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) override {
    cpu::swap_axes(outer, a, b, cols, x, y);
  }
  void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) override {
    cpu::copy_2d(rows, cols, x, ldx, y, ldy);
  }
  void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    cpu::gather_rows(count, cols, index, x, y);
  }
  void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    cpu::scatter_rows(count, cols, index, x, y);
  }
  void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                         int64_t ldy) override {
    cpu::embedding_forward(rows, dim, tokens, table, y, ldy);
  }
  void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                          float* dtable) override {
    cpu::embedding_backward(rows, dim, tokens, dy, ldy, dtable);
  }
  void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                     const int32_t* truth, int32_t* tokens) override {
    cpu::select_tokens(rows, classes, logits, use_model, truth, tokens);
  }
  void lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c, float* h,
                         float* tanh_c) override {
    cpu::lstm_cell_forward(rows, hidden, gates, c_prev, c, h, tanh_c);
  }
  void lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev, const float* tanh_c,
                          const float* dh, float* dc, float* dgates) override {
    cpu::lstm_cell_backward(rows, hidden, gates, c_prev, tanh_c, dh, dc, dgates);
  }
  void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                         const int32_t* row_utterance, const float* query, const float* keys, const float* values,
                         float* alpha, float* context, int64_t ldc) override {
    cpu::attention_forward(rows, steps, dim, cols, lengths, row_utterance, query, keys, values, alpha, context, ldc);
  }
  void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                          const int32_t* row_utterance, const float* keys, const float* values, const float* alpha,
                          const float* dcontext, float* denergy, float* dquery) override {
    cpu::attention_backward(rows, steps, dim, cols, lengths, row_utterance, keys, values, alpha, dcontext, denergy,
                            dquery);
  }

  // Optimizer arithmetic: optim_ops.cpp.
  void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) override {
    cpu::sgd_update(n, u, params, grads, momentum);
  }
  void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m,
                   float* v) override {
    cpu::adam_update(n, u, params, grads, m, v);
  }
  double sum_of_squares(int64_t n, const float* x) override { return cpu::sum_of_squares(n, x); }
  void scale(int64_t n, float alpha, float* x) override { cpu::scale(n, alpha, x); }
  void to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y) override {
    narrow_half(format, x, n, scale, y);
  }
  void from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y) override { widen_half(format, x, n, y); }
  void sum_of_squares_into(int64_t n, const float* x, double* out) override { *out = cpu::sum_of_squares(n, x); }
  void batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                const float* batch_var, float* running_mean, float* running_var) override {
    const float m = momentum;
    for (int64_t c = 0; c < channels; ++c) {
      running_mean[c] = (1.f - m) * running_mean[c] + m * batch_mean[c];
      running_var[c] = (1.f - m) * running_var[c] + m * batch_var[c] * unbias;
    }
  }

  // Sparse and low-rank gradient sync: sync_ops.cpp.
  void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix,
                           int shift, int32_t* histogram) override {
    cpu::magnitude_histogram(n, grad, acc, min_key, mask, prefix, shift, histogram);
  }
  int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                          int64_t capacity) override {
    return cpu::select_at_least(n, grad, acc, t, index, value, capacity);
  }
  void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums) override {
    cpu::accumulate_moments(n, grad, acc, sums);
  }
  void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                       float* y) override {
    cpu::sparse_to_dense(n, count, index, value, divisor, y);
  }
  void scatter_fill(int64_t count, const int32_t* index, float value, float* y) override {
    cpu::scatter_fill(count, index, value, y);
  }
  void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) override {
    cpu::momentum_correction(n, momentum, nesterov, velocity, grad);
  }
  void orthonormalize_columns(const std::vector<TallMatrix>& batch) override { cpu::orthonormalize_columns(batch); }
  void subtract(int64_t n, const float* a, const float* b, float* y) override { cpu::subtract(n, a, b, y); }
  void lerp(int64_t n, const float* start, float weight, float* y) override { cpu::lerp(n, start, weight, y); }

  // Low-bit outer gradients: low_bit_ops.cpp.
  void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks, uint8_t* chunk) override {
    cpu::quantize_blocks(format, x, count, blocks, chunk);
  }
  void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                            int64_t blocks, float* acc) override {
    cpu::sum_quantized_blocks(format, received, chunk_bytes, ranks, blocks, acc);
  }
  void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                         float* out) override {
    cpu::dequantize_blocks(format, chunk, blocks, count, out);
  }

 private:
  // layer_gemm's product: under bf16 from bf16 copies (B's kept when keep_b), else fp32.
  void layer_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool keep_b) {
    if (settings_.precision == Precision::kBf16)
      cpu::bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, keep_b);
    else
      gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  const BackendSettings settings_;
};

}  // namespace

Backend& cpu_backend(const BackendSettings& settings) {
  // Never destroyed (as the CUDA one): ops, buffers and sync state made through a backend refer to
  // it until the process ends, some from other statics.
  static std::mutex mutex;
  static auto* backends = new std::vector<std::unique_ptr<CpuBackend>>;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& b : *backends)
    if (b->settings() == settings) return *b;
  backends->push_back(std::make_unique<CpuBackend>(settings));
  return *backends->back();
}

}  // namespace trainer::models
