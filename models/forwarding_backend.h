// A backend that hands every call to another: the base of a backend that changes a few of another's
// ops or its memory, and overrides only those (the tests' device-like CPU, tests/device_like_backend.h,
// changes where memory is; the emulated CUDA backend, scripts/cuda_emulation, runs some ops as our
// kernels). A new op of a family (backend.h) is one line here. Every forwarded call but the const
// queries runs between enter() and leave(), which a derived backend may override to act around each
// call (the device-like CPU opens its guarded memory to the host for the call's length).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/backend.h"

namespace trainer::models {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  Backend& inner() { return inner_; }

  // DeviceMemory
  std::string name() const override { return inner_.name(); }
  bool is_host() const override { return inner_.is_host(); }
  void* allocate(size_t bytes) override { return forward()->allocate(bytes); }
  void free(void* p) override { forward()->free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { forward()->copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { forward()->copy_to_host(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { forward()->fill(n, value, y); }
  void synchronize() override { forward()->synchronize(); }
  void* stream_handle() override { return forward()->stream_handle(); }
  std::unique_ptr<DeviceStream> make_stream() override { return forward()->make_stream(); }
  // NnOps
  Layout activation_layout(int64_t channels) const override { return inner_.activation_layout(channels); }
  bool bf16_activations() const override { return inner_.bf16_activations(); }
  std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) override { return forward()->make_conv(g); }
  std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) override {
    return forward()->make_batchnorm(g);
  }
  std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) override { return forward()->make_pool(g); }
  std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g) override { return forward()->make_lstm(g); }
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    forward()->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    forward()->layer_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void layer_gemm_weight(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    forward()->layer_gemm_weight(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void weights_changed() override { forward()->weights_changed(); }
  void broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y) override {
    forward()->broadcast_rows(rows, cols, bias, y);
  }
  void sum_rows(int64_t rows, int64_t cols, const float* dy, float* db) override {
    forward()->sum_rows(rows, cols, dy, db);
  }
  void relu_forward(int64_t n, const float* x, float* y) override { forward()->relu_forward(n, x, y); }
  void relu_backward(int64_t n, const float* y, const float* dy, float* dx) override {
    forward()->relu_backward(n, y, dy, dx);
  }
  void add(int64_t n, const float* a, const float* b, float* y) override { forward()->add(n, a, b, y); }
  void copy(int64_t n, const float* x, float* y) override { forward()->copy(n, x, y); }
  void shortcut_a_forward(const Tensor& x, int64_t stride, int64_t pad, Tensor& y) override {
    forward()->shortcut_a_forward(x, stride, pad, y);
  }
  void shortcut_a_backward(const Tensor& dy, int64_t stride, int64_t pad, Tensor& dx) override {
    forward()->shortcut_a_backward(dy, stride, pad, dx);
  }
  void convert_layout(const Tensor& x, Tensor& y) override { forward()->convert_layout(x, y); }
  void to_nchw(const Tensor& x, float* y) override { forward()->to_nchw(x, y); }
  void from_nchw(const float* x, Tensor& y) override { forward()->from_nchw(x, y); }
  double softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits, const int32_t* labels,
                               float smoothing, float* dlogits, int64_t* correct) override {
    return forward()->softmax_cross_entropy(batch, classes, logits, labels, smoothing, dlogits, correct);
  }
  // SequenceOps
  void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                       const float* src, int64_t src_ld, float* dst, int64_t dst_ld) override {
    forward()->sequence_gather(steps, batch, cols, lengths, reverse, src, src_ld, dst, dst_ld);
  }
  void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                      float* packed) override {
    forward()->pack_sequences(steps, batch, cols, lengths, x, packed);
  }
  void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* packed,
                        float* x) override {
    forward()->unpack_sequences(steps, batch, cols, lengths, packed, x);
  }
  void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y) override {
    forward()->hardtanh_forward(n, lo, hi, x, y);
  }
  void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) override {
    forward()->hardtanh_backward(n, lo, hi, y, dy, dx);
  }
  void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                         const float* w, float* y) override {
    forward()->lookahead_forward(steps, batch, channels, context, x, w, y);
  }
  void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                          const float* w, const float* dy, float* dx, float* dw) override {
    forward()->lookahead_backward(steps, batch, channels, context, x, w, dy, dx, dw);
  }
  void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
                const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
                float* dlogits) override {
    forward()->ctc_loss(steps, batch, classes, logits, frames, labels, label_lengths, grad_scale, losses, dlogits);
  }
  void image_to_sequence(const Tensor& x, float* y) override { forward()->image_to_sequence(x, y); }
  void sequence_to_image(const float* y, Tensor& x) override { forward()->sequence_to_image(y, x); }
  void mask_width(const Tensor& x, const int32_t* lengths) override { forward()->mask_width(x, lengths); }
  void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) override {
    forward()->transpose(batch, rows, cols, x, y);
  }
  // SpellerOps
  void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) override {
    forward()->swap_axes(outer, a, b, cols, x, y);
  }
  void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) override {
    forward()->copy_2d(rows, cols, x, ldx, y, ldy);
  }
  void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    forward()->gather_rows(count, cols, index, x, y);
  }
  void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    forward()->scatter_rows(count, cols, index, x, y);
  }
  void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                         int64_t ldy) override {
    forward()->embedding_forward(rows, dim, tokens, table, y, ldy);
  }
  void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                          float* dtable) override {
    forward()->embedding_backward(rows, dim, tokens, dy, ldy, dtable);
  }
  void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model, const int32_t* truth,
                     int32_t* tokens) override {
    forward()->select_tokens(rows, classes, logits, use_model, truth, tokens);
  }
  void lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c, float* h,
                         float* tanh_c) override {
    forward()->lstm_cell_forward(rows, hidden, gates, c_prev, c, h, tanh_c);
  }
  void lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev, const float* tanh_c,
                          const float* dh, float* dc, float* dgates) override {
    forward()->lstm_cell_backward(rows, hidden, gates, c_prev, tanh_c, dh, dc, dgates);
  }
  void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                         const int32_t* row_utterance, const float* query, const float* keys, const float* values,
                         float* alpha, float* context, int64_t ldc) override {
    forward()->attention_forward(rows, steps, dim, cols, lengths, row_utterance, query, keys, values, alpha, context,
                                 ldc);
  }
  void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                          const int32_t* row_utterance, const float* keys, const float* values, const float* alpha,
                          const float* dcontext, float* denergy, float* dquery) override {
    forward()->attention_backward(rows, steps, dim, cols, lengths, row_utterance, keys, values, alpha, dcontext,
                                  denergy, dquery);
  }
  // UpdateOps
  void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) override {
    forward()->sgd_update(n, u, params, grads, momentum);
  }
  void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v) override {
    forward()->adam_update(n, u, params, grads, m, v);
  }
  double sum_of_squares(int64_t n, const float* x) override { return forward()->sum_of_squares(n, x); }
  void scale(int64_t n, float alpha, float* x) override { forward()->scale(n, alpha, x); }
  void batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                const float* batch_var, float* running_mean, float* running_var) override {
    forward()->batchnorm_update_running(channels, momentum, unbias, batch_mean, batch_var, running_mean, running_var);
  }
  // SyncOps
  void to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y) override {
    forward()->to_half(format, n, x, scale, y);
  }
  void from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y) override {
    forward()->from_half(format, n, x, y);
  }
  void sum_of_squares_into(int64_t n, const float* x, double* out) override {
    forward()->sum_of_squares_into(n, x, out);
  }
  void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix,
                           int shift, int32_t* histogram) override {
    forward()->magnitude_histogram(n, grad, acc, min_key, mask, prefix, shift, histogram);
  }
  int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                          int64_t capacity) override {
    return forward()->select_at_least(n, grad, acc, t, index, value, capacity);
  }
  void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums) override {
    forward()->accumulate_moments(n, grad, acc, sums);
  }
  void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                       float* y) override {
    forward()->sparse_to_dense(n, count, index, value, divisor, y);
  }
  void scatter_fill(int64_t count, const int32_t* index, float value, float* y) override {
    forward()->scatter_fill(count, index, value, y);
  }
  void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) override {
    forward()->momentum_correction(n, momentum, nesterov, velocity, grad);
  }
  void orthonormalize_columns(const std::vector<TallMatrix>& batch) override {
    forward()->orthonormalize_columns(batch);
  }
  void subtract(int64_t n, const float* a, const float* b, float* y) override { forward()->subtract(n, a, b, y); }
  void lerp(int64_t n, const float* start, float weight, float* y) override { forward()->lerp(n, start, weight, y); }
  void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks, uint8_t* chunk) override {
    forward()->quantize_blocks(format, x, count, blocks, chunk);
  }
  void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                            int64_t blocks, float* acc) override {
    forward()->sum_quantized_blocks(format, received, chunk_bytes, ranks, blocks, acc);
  }
  void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                         float* out) override {
    forward()->dequantize_blocks(format, chunk, blocks, count, out);
  }
  // Backend (describe() stays the base's: this backend's name)
  StepCapture* step_capture() override { return forward()->step_capture(); }

 protected:
  virtual void enter() {}
  virtual void leave() {}

 private:
  // inner_ for one call: a temporary, so leave() runs when the call's full expression ends (also
  // when it throws).
  class Call {
   public:
    explicit Call(ForwardingBackend& backend) : backend_(backend) { backend_.enter(); }
    ~Call() { backend_.leave(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    Backend* operator->() { return &backend_.inner_; }

   private:
    ForwardingBackend& backend_;
  };
  Call forward() { return Call(*this); }

  Backend& inner_;
};

}  // namespace trainer::models
