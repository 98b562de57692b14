// Our own kernels of the CUDA backend (the ops cuDNN and cuBLAS do not do, or do not do with the
// semantics of models/backend.h), callable from plain C++. Each launcher enqueues on `stream` and
// returns the launch status; none of them waits. One file per concept:
//   elementwise.cu (ReLU, add, scale, bias rows), reduce.cu (column sums, sum of squares),
//   shortcut.cu, layout.cu, loss.cu, optim_kernels.cu, batch_norm.cu (its op lives there too);
//   the speech models' sequence ops: sequence.cu (gather, packing, Hardtanh, image <-> sequence,
//   width mask, transpose), lookahead.cu, ctc.cu; Listen-Attend-Spell's rows, cells and attention:
//   speller.cu, attention.cu; runtime.precision = bf16's copies: bf16.cu; sync.wire_dtype's casts:
//   half_cast.cu; the sparse gradient-sync passes: sparse.cu; PowerSGD's orthonormalization:
//   low_rank.cu; DiLoCo's low-bit outer codec: low_bit.cu. A batch's lengths reach those kernels by
//   value (HostInts, host_ints.h),
//   never through device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "models/backend.h"
#include "models/cuda/host_ints.h"

namespace trainer::models::cuda {

// An {N, C, H, W} activation's dimensions and layout, for kernels that index it element by element.
struct ActivationDims {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t block = 0;  // channels per block of a blocked layout (the CPU backend's); 0: channels-last
};
ActivationDims dims_of(const Tensor& t);

// ---- elementwise.cu
cudaError_t launch_relu_forward(int64_t n, const float* x, float* y, cudaStream_t stream);
cudaError_t launch_relu_backward(int64_t n, const float* y, const float* dy, float* dx, cudaStream_t stream);
cudaError_t launch_add(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream);
cudaError_t launch_subtract(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream);
cudaError_t launch_lerp(int64_t n, const float* start, float weight, float* y, cudaStream_t stream);
cudaError_t launch_scale(int64_t n, float alpha, float* x, cudaStream_t stream);
// y[i, :] = bias for `rows` rows of `cols`.
cudaError_t launch_broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y, cudaStream_t stream);

// ---- bf16.cu: the bf16 copies that cuDNN's and cuBLAS's bf16 kernels read and write (bf16 as its raw
// 16 bits). Rounding to nearest even, NaN kept, as oneDNN's reorders on the CPU.
// y (rows x cols, packed) = x rows of `cols` at leading dimension ldx, rounded.
cudaError_t launch_to_bf16_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, uint16_t* y,
                              cudaStream_t stream);
cudaError_t launch_to_bf16(int64_t n, const float* x, uint16_t* y, cudaStream_t stream);
// y = x widened (exact).
cudaError_t launch_from_bf16(int64_t n, const uint16_t* x, float* y, cudaStream_t stream);

// ---- half_cast.cu: sync.wire_dtype's casts (Backend::to_half / from_half), models/half_cast.h's bits.
// y = x * scale (the product rounded alone) rounded to `format`; back: y = x widened (exact).
cudaError_t launch_to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y,
                           cudaStream_t stream);
cudaError_t launch_from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y, cudaStream_t stream);

// ---- reduce.cu. Both sum in double over fixed row chunks / element blocks in a fixed order, so the
// result depends on the shape only (never on timing).
// db[j] = sum_i dy[i, j]. `partial` holds column_sum_partials(rows, cols) doubles.
int64_t column_sum_partials(int64_t rows, int64_t cols);
cudaError_t launch_sum_rows(int64_t rows, int64_t cols, const float* dy, float* db, double* partial,
                            cudaStream_t stream);
// *result = sum x[i]^2. `partial` holds sum_of_squares_partials(n) doubles; result is one device double.
int64_t sum_of_squares_partials(int64_t n);
cudaError_t launch_sum_of_squares(int64_t n, const float* x, double* partial, double* result, cudaStream_t stream);

// ---- sparse.cu: the sparse gradient-sync passes (backend.h). grad null: acc is only read.
// histogram: 256 device int32, zeroed here, then counted.
cudaError_t launch_magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask,
                                       uint32_t prefix, int shift, int32_t* histogram, cudaStream_t stream);
// Selection of |acc| >= t in index order, in two launches: count_at_least leaves in `counts`
// (select_blocks(n) + 1 device int64) each block's offset and, last, the total; write_at_least then
// writes the entries (index and value need room for the total).
int64_t select_blocks(int64_t n);
cudaError_t launch_count_at_least(int64_t n, const float* grad, float* acc, float t, int64_t* counts,
                                  cudaStream_t stream);
cudaError_t launch_write_at_least(int64_t n, const float* acc, float t, const int64_t* offsets, int32_t* index,
                                  float* value, cudaStream_t stream);
// sums[0, 2) = sum acc, sum acc^2 (device doubles); `partial` holds 2 * moments_partials(n) doubles.
int64_t moments_partials(int64_t n);
cudaError_t launch_accumulate_moments(int64_t n, const float* grad, float* acc, double* partial, double* sums,
                                      cudaStream_t stream);
cudaError_t launch_sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                                   float* y, cudaStream_t stream);
cudaError_t launch_scatter_fill(int64_t count, const int32_t* index, float value, float* y, cudaStream_t stream);
cudaError_t launch_momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad,
                                       cudaStream_t stream);

// ---- low_rank.cu: PowerSGD's Gram-Schmidt (backend.h), one block per matrix; `batch` (count
// entries) in device memory.
cudaError_t launch_orthonormalize_columns(int64_t count, const TallMatrix* batch, cudaStream_t stream);

// ---- low_bit.cu: the low-bit codec of the outer allreduce (backend.h, "Low-bit outer gradients"),
// the CPU's bytes (models/cpu/low_bit_ops.cpp) but for the sign and payload of NaNs. Chunks are
// device bytes in models/low_bit_blocks.h's layout.
cudaError_t launch_quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks,
                                   uint8_t* chunk, cudaStream_t stream);
cudaError_t launch_sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                                        int64_t blocks, float* acc, cudaStream_t stream);
cudaError_t launch_dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                                     float* out, cudaStream_t stream);

// ---- shortcut.cu: option-A shortcut (backend.h).
cudaError_t launch_shortcut_a_forward(const float* x, ActivationDims xd, int64_t stride, int64_t pad, float* y,
                                      ActivationDims yd, cudaStream_t stream);
cudaError_t launch_shortcut_a_backward(const float* dy, ActivationDims dyd, int64_t stride, int64_t pad, float* dx,
                                       ActivationDims dxd, cudaStream_t stream);

// ---- layout.cu: a tensor in its layout <-> PyTorch's NCHW order; filters to and from channels-last.
cudaError_t launch_to_nchw(const float* x, ActivationDims d, float* nchw, cudaStream_t stream);
cudaError_t launch_from_nchw(const float* nchw, ActivationDims d, float* y, cudaStream_t stream);

// Convolution filters: PyTorch's {O, I, KH, KW} (what parameters hold) <-> {O, KH, KW, I} (what
// cuDNN's channels-last convolutions take), n_out * n_in * kh * kw floats.
cudaError_t launch_filter_to_channels_last(const float* oihw, int64_t n_out, int64_t n_in, int64_t kh, int64_t kw,
                                           float* ohwi, cudaStream_t stream);
cudaError_t launch_filter_from_channels_last(const float* ohwi, int64_t n_out, int64_t n_in, int64_t kh, int64_t kw,
                                             float* oihw, cudaStream_t stream);

// ---- loss.cu: softmax cross-entropy with label smoothing (backend.h). Writes dlogits (if non-null)
// and result[0] = the summed loss, result[1] = the number of correct argmaxes (as a double);
// `row_loss` holds `batch` doubles and `row_hit` `batch` ints of scratch.
cudaError_t launch_softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits,
                                         const int32_t* labels, float smoothing, float* dlogits, double* row_loss,
                                         int32_t* row_hit, double* result, cudaStream_t stream);

// ---- optim_kernels.cu: the arithmetic of models/cpu/optim_ops.cpp, element for element.
cudaError_t launch_sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum,
                              cudaStream_t stream);
cudaError_t launch_adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v,
                               cudaStream_t stream);

// ---- batch_norm.cu
std::unique_ptr<BatchNormOp> make_batchnorm_op(const BatchNormGeometry& g, DeviceMemory& memory, cudaStream_t stream);
// running = (1 - momentum) * running + momentum * batch (the variance times `unbias`), per channel.
cudaError_t launch_batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                            const float* batch_var, float* running_mean, float* running_var,
                                            cudaStream_t stream);

// ---- sequence.cu: the sequence moves of backend.h ("Sequences"), CPU semantics
// (models/cpu/sequence_ops.cpp). `lengths` holds `batch` values (one per image for mask_width).
cudaError_t launch_sequence_gather(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths, bool reverse,
                                   const float* src, int64_t src_ld, float* dst, int64_t dst_ld, cudaStream_t stream);
cudaError_t launch_pack_sequences(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths, const float* x,
                                  float* packed, cudaStream_t stream);
cudaError_t launch_unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths,
                                    const float* packed, float* x, cudaStream_t stream);
cudaError_t launch_hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y, cudaStream_t stream);
cudaError_t launch_hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx,
                                     cudaStream_t stream);
// image {N, C, H, W} in its layout <-> sequence {W, N, C*H} (feature c*H + h).
cudaError_t launch_image_to_sequence(const float* image, ActivationDims d, float* sequence, cudaStream_t stream);
cudaError_t launch_sequence_to_image(const float* sequence, ActivationDims d, float* image, cudaStream_t stream);
cudaError_t launch_mask_width(float* x, ActivationDims d, const HostInts& lengths, cudaStream_t stream);
// y[b, j, i] = x[b, i, j] for x {batch, rows, cols}.
cudaError_t launch_transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y, cudaStream_t stream);

// ---- lookahead.cu: y[t, n, c] = sum_k w[c, k] * x[t + k, n, c] and its gradients. dw is summed in
// double over fixed row chunks (deterministic); `partial` holds lookahead_dw_partials(...) doubles.
int64_t lookahead_dw_partials(int64_t steps, int64_t batch, int64_t channels, int64_t context);
cudaError_t launch_lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                                     const float* w, float* y, cudaStream_t stream);
cudaError_t launch_lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                                      const float* w, const float* dy, float* dx, float* dw, double* partial,
                                      cudaStream_t stream);

// ---- ctc.cu: CTC loss (backend.h), in double as models/cpu/ctc.cpp. `labels` is on the device
// (sum of label_lengths ids); label_lengths >= 0 and every label in [0, classes). Scratch: `lp`
// holds steps * batch * classes doubles, `alpha` and `beta` ctc_states(...) doubles each (beta is
// unused without dlogits), `losses` batch doubles (-log p per utterance, +inf where the labels
// cannot be aligned). dlogits (optional) gets every row written, zeros in padding frames.
int64_t ctc_states(int64_t steps, int64_t batch, const HostInts& frames, const HostInts& label_lengths);
cudaError_t launch_ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const HostInts& frames,
                            const int32_t* labels, const HostInts& label_lengths, float grad_scale, double* lp,
                            double* alpha, double* beta, double* losses, float* dlogits, cudaStream_t stream);

// ---- speller.cu: the row and speller ops of backend.h (swap_axes ... select_tokens, the LSTM
// cell), the CPU loops' arithmetic element for element. Token ids and indices are device ints.
cudaError_t launch_swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y,
                             cudaStream_t stream);
cudaError_t launch_gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y,
                               cudaStream_t stream);
cudaError_t launch_scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y,
                                cudaStream_t stream);
cudaError_t launch_embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                                     int64_t ldy, cudaStream_t stream);
// One thread per column walking the rows in order: deterministic, no atomics.
cudaError_t launch_embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                                      float* dtable, cudaStream_t stream);
cudaError_t launch_select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                                 const int32_t* truth, int32_t* tokens, cudaStream_t stream);
cudaError_t launch_lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c,
                                     float* h, float* tanh_c, cudaStream_t stream);
cudaError_t launch_lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev,
                                      const float* tanh_c, const float* dh, float* dc, float* dgates,
                                      cudaStream_t stream);

// ---- attention.cu: attention_forward / attention_backward (backend.h), one block per row, sums in
// a fixed order. The lengths and the row -> utterance map (empty: the identity) go by value.
cudaError_t launch_attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const HostInts& lengths,
                                     const HostInts& row_utterance, const float* query, const float* keys,
                                     const float* values, float* alpha, float* context, int64_t ldc,
                                     cudaStream_t stream);
cudaError_t launch_attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const HostInts& lengths,
                                      const HostInts& row_utterance, const float* keys, const float* values,
                                      const float* alpha, const float* dcontext, float* denergy, float* dquery,
                                      cudaStream_t stream);

// ---- step_kernels.cu: a captured step's own decisions (models/step_capture.h), one thread each
// except the two passes over n floats.
cudaError_t launch_begin_step(StepControl* c, cudaStream_t stream);
cudaError_t launch_poison_if_nonfinite(StepControl* c, float* grad_element, cudaStream_t stream);
// After launch_sum_of_squares wrote c->norm_sq: skip and clip_scale.
cudaError_t launch_clip_decide(StepControl* c, double max_norm, cudaStream_t stream);
cudaError_t launch_scale_by_control(int64_t n, const StepControl* c, float* x, cudaStream_t stream);
cudaError_t launch_copy_if_skipped(int64_t n, const StepControl* c, const float* src, float* dst,
                                   cudaStream_t stream);
cudaError_t launch_end_step(StepControl* c, cudaStream_t stream);

}  // namespace trainer::models::cuda
