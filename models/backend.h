// The device seam. Layers never call oneDNN, cuDNN or BLAS directly: they ask a Backend for ops.
//
// Ops with per-shape setup (convolution, batch norm, pooling) are objects made once per layer and
// shape: they cache the library's primitives, reordered weights and workspaces, so a training step
// allocates nothing. Stateless ops (GEMM, element-wise loops, the loss) are plain methods.
// All pointers are device pointers of this backend (host memory for the CPU backend) unless a
// comment says host; layouts follow models/tensor.h. The backend chooses the layout of every
// activation a convolution produces (activation_layout); the other ops keep the layout they are given.
//
// A backend is also its device's memory and stream (DeviceMemory, models/device_memory.h;
// architecture.md section 2, "The device seam"): buffers are allocated through it, and its ops are
// enqueued on the same stream as its copies. A method that returns a host value computed from device
// data (softmax_cross_entropy, sum_of_squares) waits for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/backend_settings.h"
#include "models/device_memory.h"
#include "models/low_bit_blocks.h"
#include "models/half_cast.h"
#include "models/step_capture.h"
#include "models/tensor.h"

namespace trainer::models {

struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool bias = false;
  Layout src_layout = Layout::kChannelsLast, dst_layout = Layout::kChannelsLast;
  // The input's and output's formats (tensor.h); the gradients have the same. bf16 only where the
  // backend keeps bf16 activations (Backend::bf16_activations).
  DType src_dtype = DType::kF32, dst_dtype = DType::kF32;
  int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  bool operator==(const ConvGeometry& o) const;
};

class ConvOp {
 public:
  virtual ~ConvOp() = default;
  // The layout forward writes y in (and backward reads dy in): the geometry's dst_layout where the
  // backend has fast kernels for it, else the one it chose instead (the CPU backend: see
  // DnnlConv). Backward writes dx in the geometry's src_layout.
  virtual Layout output_layout() const = 0;
  // y = conv(x, w) + b. b may be null when the geometry has no bias.
  virtual void forward(const float* x, const float* w, const float* b, float* y) = 0;
  // dx = conv_transpose(dy, w). w must be the weights of the preceding forward. When it follows
  // backward_weights with the same dy, dy must be unchanged in between (bf16 reuses its copy).
  virtual void backward_data(const float* dy, const float* w, float* dx) = 0;
  // dw (and db when the geometry has a bias) from the forward input (the preceding forward's x,
  // unchanged since) and dy. Overwrites dw/db.
  virtual void backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;
};

// Batch normalization over all axes but channels: `rows` = N*H*W samples of `channels` values.
struct BatchNormGeometry {
  int64_t batch = 0, channels = 0, h = 1, w = 1;
  float eps = 1e-5f;
  bool fuse_relu = false;  // y = relu(bn(x)); backward then takes the gradient of the ReLU output
  // forward_training normalizes with the mean/var it is given (inputs, not outputs) and backward
  // treats them as constants: batch norm with frozen statistics, which makes a batch's gradient
  // the mean of its samples' gradients (so data parallelism equals one process exactly).
  bool frozen_stats = false;
  Layout layout = Layout::kChannelsLast;
  DType dtype = DType::kF32;  // of x, y and their gradients; the statistics and gamma/beta are fp32
  bool operator==(const BatchNormGeometry& o) const;
};

class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Uses batch statistics; writes the batch mean and the biased variance (what the normalization
  // used) to mean/var so the layer can update running statistics and backward can reuse them.
  virtual void forward_training(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* var) = 0;
  virtual void forward_inference(const float* x, const float* gamma, const float* beta,
                                 const float* mean, const float* var, float* y) = 0;
  // Gradients of the last forward_training. Overwrites dx, dgamma, dbeta.
  virtual void backward(const float* x, const float* dy, const float* gamma, const float* beta,
                        const float* mean, const float* var, float* dx, float* dgamma, float* dbeta) = 0;
};

enum class PoolKind { kMax, kAverage };  // average excludes padding

struct PoolGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  PoolKind kind = PoolKind::kMax;
  Layout layout = Layout::kChannelsLast;
  DType dtype = DType::kF32;  // of x, y and their gradients
  int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  bool operator==(const PoolGeometry& o) const;
};

class PoolOp {
 public:
  virtual ~PoolOp() = default;
  virtual void forward(const float* x, float* y, bool training) = 0;
  // Gradient of the last training forward. Overwrites dx.
  virtual void backward(const float* dy, float* dx) = 0;
};

// A whole LSTM: torch.nn.LSTM(input, hidden, num_layers = layers, bidirectional) without dropout,
// time-major, from a zero initial state, over a padded batch with lengths, computing what PyTorch
// computes on the packed sequence (gates i, f, g, o in that order; weights in its layout, so they
// interchange). One op per layer, whatever the batches' shapes: speech batches change T (and the
// last one N) from step to step, and a cuDNN RNN only needs them per call, while making one
// allocates its weight spaces. The CPU backend runs it as a loop over layers and directions
// (models/cpu/lstm_ops.h, keeping oneDNN's primitives per shape inside), the CUDA backend as one
// cuDNN RNN (models/cuda/cudnn_lstm.cpp).
struct LstmGeometry {
  int64_t input = 0, hidden = 0;
  int64_t layers = 1;
  bool bidirectional = false;
  int64_t directions() const { return bidirectional ? 2 : 1; }
  // The input width of layer k: the op's input, then the previous layer's D*H features.
  int64_t layer_input(int64_t k) const { return k == 0 ? input : directions() * hidden; }
  bool operator==(const LstmGeometry& o) const;
};

// The parameters of every (layer k, direction d), index k * D + d (d = 1: the reverse direction),
// as PyTorch's weight_ih_l{k}[_reverse] {4H, layer_input(k)}, weight_hh_l{k}[_reverse] {4H, H},
// bias_ih_l{k}[_reverse] {4H}, bias_hh_l{k}[_reverse] {4H}. Device pointers.
struct LstmWeights {
  std::vector<const float*> w_ih, w_hh, b_ih, b_hh;
};
// Their gradients, indexed the same way.
struct LstmGradients {
  std::vector<float*> w_ih, w_hh, b_ih, b_hh;
};

class LstmOp {
 public:
  virtual ~LstmOp() = default;
  // x {T, N, I} -> y {T, N, D*H}, T = steps, N = batch (per step the forward direction's H features,
  // then the reverse direction's). lengths: a host array of N values in [1, T] (the CPU backend also takes 0, an
  // empty sequence; cuDNN fails on those); sequence n's reverse direction starts at its own step
  // lengths[n] - 1. Rows t >= lengths[n] of x are padding and do not affect y or any gradient
  // (finite values; the models pass zeros); those rows of y are written as zeros.
  // Training keeps what backward needs (gate activations, cell states) inside the op.
  virtual void forward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w,
                       float* y, bool training) = 0;
  // Gradients of the last training forward, given its shape, x, lengths, weights and output y (all
  // unchanged since; one backward per training forward). dy's padding rows are ignored. Overwrites
  // dx (zero on padding rows) and every gradient in `grads` (the two biases of a (layer, direction)
  // get the same gradient).
  virtual void backward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w,
                        const float* y, const float* dy, float* dx, const LstmGradients& grads) = 0;
};

// The coefficients of one fused SGD update (optim/sgd.h), already rounded to float by the optimizer:
//     g = grad * grad_scale + wd * p;  (grad_scale: the clip's coefficient, optim/clip.h; 1: none)  with momentum: b = first ? g : momentum * b + g;  g = nesterov ? g + momentum * b : b
//     p = p * decay + neg_lr * g
// In a captured step (control non-null, device memory) neg_lr and decay are read from the control
// block instead (coefficients[updates_applied - base_count] = {neg_lr, decay}), and the update is
// skipped when control->skip is set.
struct SgdUpdate {
  float neg_lr = 0, wd = 0, decay = 1, momentum = 0;
  bool use_momentum = false, first = false, nesterov = false;
  float grad_scale = 1;  // after the flags: braced lists written before it keep their meaning
  const StepControl* control = nullptr;
};

// The coefficients of one fused Adam/AdamW update (optim/adam.h), already rounded to float:
//     p = p * decay;  g = fma(wd, p, grad * grad_scale);  (grad_scale as SgdUpdate's)  m = fma(1 - b1, g, m * b1);  v = fma((1 - b2) * g, g, v * b2)
//     p = p + neg_step_size * m / (sqrt(v) / bc2_sqrt + eps)
// In a captured step (control non-null) neg_step_size, bc2_sqrt and decay come from the control
// block's coefficients, as SgdUpdate's.
struct AdamUpdate {
  float neg_step_size = 0, bc2_sqrt = 1, eps = 0, b1 = 0, one_minus_b1 = 1, b2 = 0, one_minus_b2 = 1;
  float wd = 0, decay = 1;
  float grad_scale = 1;  // last but the control: braced lists written before it keep their meaning
  const StepControl* control = nullptr;
};

// Memory, copies, fill and synchronize come from DeviceMemory; device-to-device copies of floats are
// copy() below.
// A row-major rows x cols matrix in a backend's memory (Backend::orthonormalize_columns).
struct TallMatrix {
  float* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// A backend is these families of ops over its memory (Backend, below, joins them). A backend
// that changes a few ops of another derives from ForwardingBackend (forwarding_backend.h) and
// overrides only those.

// The image networks' ops, and the GEMMs, activations and loss every model uses.
class NnOps {
 public:
  virtual ~NnOps() = default;
  // The layout convolutions write for an output of `channels` channels.
  virtual Layout activation_layout(int64_t channels) const = 0;
  // Whether the image networks keep their activations in bf16 (tensor.h, DType): the CPU backend
  // under runtime.precision = bf16. Convolutions, batch norm, pooling and the activation ops below
  // then take bf16 tensors.
  virtual bool bf16_activations() const { return false; }

  virtual std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) = 0;
  virtual std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) = 0;
  virtual std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) = 0;
  virtual std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g) = 0;

  // C = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X^T when trans_X.
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) = 0;
  // The same product for a model's layers (Linear), in the precision the layers compute in
  // (runtime.precision: under bf16 the CPU backend rounds A and B to bf16 and accumulates in fp32).
  // gemm() above is always fp32: it is also the gradient sync's (PowerSGD's factors).
  virtual void layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // layer_gemm where B is one of the model's weights and many calls read it unchanged (LAS's
  // speller: every weight once per time step, forward and backward). The model calls
  // weights_changed() whenever its weights may have new values (at the start of every forward and
  // decode); until then the CPU backend under bf16 keeps B's bf16 copy instead of rounding B again.
  virtual void layer_gemm_weight(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                                 int64_t ldc) {
    layer_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  virtual void weights_changed() {}
  // y[i, :] = bias (broadcast over `rows` rows of `cols`): used before a GEMM accumulates into y.
  virtual void broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y) = 0;
  // db[j] = sum_i dy[i, j].
  virtual void sum_rows(int64_t rows, int64_t cols, const float* dy, float* db) = 0;

  virtual void relu_forward(int64_t n, const float* x, float* y) = 0;
  // dx = dy where y > 0, else 0 (y: the ReLU output).
  virtual void relu_backward(int64_t n, const float* y, const float* dy, float* dx) = 0;
  virtual void add(int64_t n, const float* a, const float* b, float* y) = 0;
  virtual void copy(int64_t n, const float* x, float* y) = 0;

  // The residual block's element-wise ops on activations of either dtype (tensor.h; bf16 computed in
  // fp32 and rounded once to nearest even): y = relu(a + b) (y may be a or b), and dx = dy where y >
  // 0, else 0. The defaults run relu_forward / add / relu_backward on fp32 tensors and refuse bf16.
  virtual void add_relu_tensors(const Tensor& a, const Tensor& b, Tensor& y);
  virtual void relu_backward_tensors(const Tensor& y, const Tensor& dy, Tensor& dx);
  // y = a + b on activations of either dtype (the residual block's input gradient).
  virtual void add_tensors(const Tensor& a, const Tensor& b, Tensor& y);

  // Option-A shortcut of CIFAR ResNets: spatial subsampling by `stride`, then `pad` zero channels
  // on each side (x.dim(1) + 2*pad out, in layout y.layout). Backward keeps the gradient of the
  // data channels. The tensors carry shapes and layouts; y/dx must be sized by the caller.
  virtual void shortcut_a_forward(const Tensor& x, int64_t stride, int64_t pad, Tensor& y) = 0;
  virtual void shortcut_a_backward(const Tensor& dy, int64_t stride, int64_t pad, Tensor& dx) = 0;

  // y = x in y.layout (shapes and dtypes equal): the one reorder where a consumer wants another
  // layout than the producer chose (a residual add whose branches' convolutions chose differently).
  virtual void convert_layout(const Tensor& x, Tensor& y) = 0;
  // PyTorch's NCHW order (what its flatten and its tensors see; fp32) <-> a tensor in any layout
  // (and dtype: a bf16 tensor is widened, or rounded to nearest even on the way in).
  virtual void to_nchw(const Tensor& x, float* y) = 0;
  virtual void from_nchw(const float* x, Tensor& y) = 0;

  // Mean softmax cross-entropy over the batch with label smoothing `smoothing` (PyTorch's
  // definition: target = (1 - s) * one_hot + s / classes). Writes dlogits (gradient of the mean
  // loss) when non-null, and the number of correct argmax predictions to *correct when non-null.
  virtual double softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits,
                                       const int32_t* labels, float smoothing, float* dlogits,
                                       int64_t* correct) = 0;
};

// Sequences (speech models). A batch of sequences is time-major {T, N, C} with the true
// lengths in a host array (lengths[n] <= T); rows (t, n) with t >= lengths[n] are padding.
class SequenceOps {
 public:
  virtual ~SequenceOps() = default;

  // dst row (t, n) = src row (t', n) for t < lengths[n], with t' = lengths[n] - 1 - t when `reverse`
  // (each sequence reversed within its own length) else t'= t; padding rows of dst are zeroed. Rows
  // are `cols` floats, `src_ld` / `dst_ld` floats apart, so this also moves one direction of a
  // bidirectional LSTM in or out of the concatenated features. src and dst must not overlap.
  virtual void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                               const float* src, int64_t src_ld, float* dst, int64_t dst_ld) = 0;
  // The valid rows of x {T, N, C}, in (t, n) order, packed into {sum(lengths), C}; and back, with
  // zeros in the padding rows.
  virtual void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                              float* packed) = 0;
  virtual void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths,
                                const float* packed, float* x) = 0;

  // y = min(max(x, lo), hi); backward passes dy where lo < y < hi (PyTorch's Hardtanh gradient).
  virtual void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y) = 0;
  virtual void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) = 0;

  // Lookahead convolution (Wang et al. 2016) over x {T, N, C}: y[t, n, c] = sum_{k=0..context}
  // w[c, k] * x[t + k, n, c], with x zero past T. Backward overwrites dx and dw {C, context + 1}.
  virtual void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                                 const float* w, float* y) = 0;
  virtual void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context,
                                  const float* x, const float* w, const float* dy, float* dx, float* dw) = 0;

  // CTC loss (Graves et al. 2006; blank = 0) of each utterance from unnormalized logits
  // {T, N, classes} through a log-softmax over classes: losses[n] = -log p(labels_n | frames 0 ..
  // frames[n]-1 of n). labels holds every utterance's label_lengths[n] ids back to back. dlogits,
  // when non-null, receives grad_scale * d losses[n] / d logits (zero in padding frames). An
  // utterance whose labels cannot be aligned within its frames gets an infinite loss and a zero
  // gradient (PyTorch's ctc_loss gives inf and, with zero_infinity, the zero gradient).
  virtual void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
                        const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
                        float* dlogits) = 0;

  // An image {N, C, H, W} (any layout) <-> the time-major sequence {W, N, C*H} over its width, with
  // feature c*H + h: PyTorch's x.view(N, C*H, W).permute(2, 0, 1), how a convolutional front end
  // feeds an RNN running along time = width.
  virtual void image_to_sequence(const Tensor& x, float* y) = 0;
  virtual void sequence_to_image(const float* y, Tensor& x) = 0;
  // Zeroes, in place, the columns w >= lengths[n] of every image n of x {N, C, H, W} (any layout).
  virtual void mask_width(const Tensor& x, const int32_t* lengths) = 0;
  // y[b, j, i] = x[b, i, j] for x {batch, rows, cols} row-major.
  virtual void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) = 0;
};

// Rows and the attention speller (Listen-Attend-Spell, models/nets/las.cpp). As above,
// per-utterance lengths and a row -> utterance map are host arrays; token ids and row indices,
// which the device produces or reads at every step, are device int32 arrays.
class SpellerOps {
 public:
  virtual ~SpellerOps() = default;

  // y {outer, b, a, cols} = x {outer, a, b, cols} with the middle axes swapped: y[o, j, i, :] =
  // x[o, i, j, :]. With outer = 1 it moves a batch between time-major {T, N, C} and
  // utterance-major {N, T, C}; with a = 2, b = N it puts neighbouring frames of a time-major
  // sequence side by side ({T/2, 2, N, C} -> {T/2, N, 2 C}: a pyramidal BLSTM's input), and with
  // a = N, b = 2 takes them apart again. x and y must not overlap.
  virtual void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) = 0;
  // y[i * ldy + j] = x[i * ldx + j] for i < rows, j < cols (ldx, ldy >= cols): a block of columns
  // from one matrix into another, such as one part of concatenated features.
  virtual void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) = 0;
  // y[i, :] = x[index[i], :] for i < count (rows of `cols`); index on the device.
  virtual void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) = 0;
  // y[index[i], :] = x[i, :] for i < count (distinct indices; y's other rows unchanged).
  virtual void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) = 0;

  // Embedding lookup: y[r * ldy + k] = table[tokens[r] * dim + k] for r < rows, k < dim; token ids
  // (device) must be rows of the table.
  virtual void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                                 int64_t ldy) = 0;
  // Its gradient, added: dtable[tokens[r], :] += dy[r * ldy + 0 .. dim) for r = 0, 1, ... in that
  // order, so a repeated token's rows sum in row order (deterministic: no atomics on a GPU).
  virtual void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                                  float* dtable) = 0;
  // Teacher forcing's input tokens: tokens[r] = use_model[r] ? argmax_c logits[r, c] (the first
  // largest, as std::max_element) : truth[r]. Device ints; tokens may be truth.
  virtual void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                             const int32_t* truth, int32_t* tokens) = 0;

  // One step of an LSTM cell (PyTorch's LSTMCell, gates i, f, g, o) after its GEMMs, over `rows`
  // rows of `hidden` units: gates {rows, 4 hidden} hold the pre-activations on entry and the
  // activations (sigmoid, sigmoid, tanh, sigmoid) on exit; c = f * c_prev + i * g, tanh_c = tanh(c),
  // h = o * tanh_c (c_prev, c, h, tanh_c {rows, hidden}).
  virtual void lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c, float* h,
                                 float* tanh_c) = 0;
  // Its backward from the forward's gates (activations), c_prev and tanh_c: given dh and dc (the
  // gradient of c from the next step), writes dgates (of the pre-activations) and replaces dc by the
  // gradient of c_prev.
  virtual void lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev,
                                  const float* tanh_c, const float* dh, float* dc, float* dgates) = 0;

  // Dot-product attention of `rows` queries {rows, dim}, row r over the keys {N, steps, dim} and
  // values {N, steps, cols} of utterance u = row_utterance[r] (host; null: u = r), whose first
  // len = lengths[u] steps are valid (host; 1 <= len <= steps):
  //     alpha[r, tau] = softmax over tau < len of <query[r], keys[u, tau]> (the maximum subtracted
  //                     first), 0 for len <= tau < steps;
  //     context[r * ldc + k] = sum_tau alpha[r, tau] values[u, tau, k].
  virtual void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                                 const int32_t* row_utterance, const float* query, const float* keys,
                                 const float* values, float* alpha, float* context, int64_t ldc) = 0;
  // Its backward from alpha and dcontext {rows, cols}: denergy[r, tau] = alpha (dalpha - <alpha,
  // dalpha>) with dalpha[tau] = <values[u, tau], dcontext[r]> (0 for tau >= len), and dquery[r] =
  // sum_tau denergy[r, tau] keys[u, tau]. The keys' and values' gradients are sums over rows, the
  // caller's GEMMs (denergy^T query, alpha^T dcontext).
  virtual void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                                  const int32_t* row_utterance, const float* keys, const float* values,
                                  const float* alpha, const float* dcontext, float* denergy, float* dquery) = 0;
};

// Optimizer arithmetic (optim/): the updates run where the parameters are. Every element is
// independent, and reductions sum fixed blocks in a fixed order, so results do not depend on the
// thread count (or, on a GPU, the launch shape).
// params and momentum (null unless u.use_momentum) updated in place from grads (unchanged).
class UpdateOps {
 public:
  virtual ~UpdateOps() = default;
  virtual void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) = 0;
  virtual void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m,
                           float* v) = 0;
  // sum_i x[i]^2 accumulated in double; waits for the result (a host value).
  virtual double sum_of_squares(int64_t n, const float* x) = 0;
  // x[0, n) *= alpha.
  virtual void scale(int64_t n, float alpha, float* x) = 0;



  // Batch norm's running statistics after a training forward (PyTorch's convention), per channel:
  //     running_mean = (1 - momentum) * running_mean + momentum * batch_mean
  //     running_var  = (1 - momentum) * running_var + momentum * batch_var * unbias
  // (unbias = M / (M - 1) turns the biased batch variance into the unbiased one).
  virtual void batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                        const float* batch_var, float* running_mean, float* running_var) = 0;
};

// The 16-bit wire formats of dense gradient sync (sync.wire_dtype, comm/wire_format.h), where
// the gradient lives. to_half: y[i] = x[i] * scale (in fp32) rounded to `format`; from_half:
// y[i] = x[i] widened (exact). models/half_cast.h defines the bits: every device gives the CPU's,
// whose ops are that header's host loops.
class SyncOps {
 public:
  virtual ~SyncOps() = default;
  virtual void to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y) = 0;
  virtual void from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y) = 0;
  // sum_of_squares' sum written to *out (one double in this backend's memory) without waiting: the
  // overlapped buckets' finiteness check, read once per step (comm/sync/methods/dense/bucket_reducer.h).
  virtual void sum_of_squares_into(int64_t n, const float* x, double* out) = 0;

  // ---- Sparse gradient sync (comm/sync/methods/sparse/sparse_passes.h): the passes over gradient-sized buffers
  // of the sparse methods (oktopk, topka, gaussiank, gtopk) where the gradient lives; what they do
  // with their k-entry lists stays on the host. Each op that takes `grad` forms error feedback's
  // acc = grad + residual into `acc` first, in the same pass, when grad is not null (one float add
  // per entry, so any device gives the host's bits); with grad null, `acc` is only read.
  // A magnitude's key is the bits of |acc_i| (for non-negative floats bit order is numeric order).
  //
  // One digit of a radix select over the keys: histogram[d] (256 int32 in this backend's memory,
  // overwritten) counts the entries with min_key <= key <= the key of +inf (NaN never counts),
  // (key & mask) == prefix, and (key >> shift) & 255 == d.
  virtual void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask,
                                   uint32_t prefix, int shift, int32_t* histogram) = 0;
  // Stream compaction: the entries with |acc_i| >= t, in index order, into index and value (the
  // first `capacity` of them; index holds int32 in float-sized slots of this backend's memory).
  // Returns how many there are, which may exceed capacity (then call again, grad null, with room):
  // the count is read back, so this waits for the device.
  virtual int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                                  int64_t capacity) = 0;
  // GaussianK's moments: acc = grad + acc (grad required), then sums[0] = sum acc_i and
  // sums[1] = sum acc_i^2 (host doubles; waits),
  // accumulated in double in a fixed order (the CPU: per-thread partials in thread order; a GPU:
  // fixed blocks), so the last bits of the sums may differ between devices.
  virtual void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums) = 0;
  // The dense output of a sparse step: y = 0 except y[index[j]] = value[j] / divisor (the indices
  // distinct, in this backend's memory).
  virtual void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                               float* y) = 0;
  // y[index[j]] = value for j < count (error feedback's clears).
  virtual void scatter_fill(int64_t count, const int32_t* index, float value, float* y) = 0;
  // DGC's momentum correction (comm/sync/wrappers/dgc.h), per entry: velocity = fma(m, velocity, grad) and
  // grad = velocity; with `nesterov`, t = velocity + grad, velocity = m * t and grad = fma(m, t, grad)
  // (the new velocity plus the gradient, rounded once). Float32, the same rounding on every device.
  virtual void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) = 0;

  // ---- Low-rank gradient sync (PowerSGD, comm/sync/methods/powersgd/powersgd.h).
  // Makes each matrix's columns orthonormal, in place, by Gram-Schmidt with dot products in double:
  // each column is normalized after the earlier ones are projected out, twice when there are more
  // than two columns ("twice is enough": Householder QR's orthogonality, QR's Q up to column signs).
  // A column whose norm after projection is at most kDependentColumn of its norm before (or zero,
  // or not finite) is set to zero rather than normalized from rounding noise.
  static constexpr double kDependentColumn = 1e-4;
  virtual void orthonormalize_columns(const std::vector<TallMatrix>& batch) = 0;
  // y = a - b (error feedback's residual = acc - what was sent).
  virtual void subtract(int64_t n, const float* a, const float* b, float* y) = 0;

  // ---- Outer steps (DiLoCo, comm/sync/methods/outer/diloco.h).
  // y = lerp(start, y, weight) elementwise, torch.lerp's arithmetic in float: from the nearer end
  // (|weight| < 0.5: start + weight (y - start); else y - (y - start)(1 - weight)), each product
  // and sum rounded on its own, so that weight 0 gives start and 1 gives y exactly.
  virtual void lerp(int64_t n, const float* start, float weight, float* y) = 0;

  // ---- Low-bit outer gradients (comm/quantized_allreduce.h, DiLoCo's sync.diloco.outer_dtype): the codec
  // of the quantized sum, in the formats and chunk layout of models/low_bit_blocks.h. A chunk is raw
  // bytes in this backend's memory: `blocks` blocks of kQuantBlock elements (scales, then codes).
  // Each element's arithmetic is fixed (one fp32 multiply and a conversion; one fma per rank, in rank
  // order), so every backend writes the CPU's bytes (a NaN's sign and payload aside: a GPU's
  // arithmetic makes its canonical NaN where x86 propagates an operand's).
  // chunk = x[0, count) quantized (count <= blocks * kQuantBlock; the elements past count are
  // zeros, and the blocks wholly past it have scale 0).
  virtual void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks,
                               uint8_t* chunk) = 0;
  // The owner's sum: acc[0, blocks * kQuantBlock) = 0, then acc = fma(decode(q), scale, acc) over
  // the `ranks` chunks of `blocks` blocks at received + r * chunk_bytes, r = 0, 1, ... in order.
  virtual void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                                    int64_t blocks, float* acc) = 0;
  // out[0, count) = decode(q) * scale, from a chunk of `blocks` blocks (count <= blocks * kQuantBlock).
  virtual void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                                 float* out) = 0;
};

class Backend : public DeviceMemory,
                public NnOps,
                public SequenceOps,
                public SpellerOps,
                public UpdateOps,
                public SyncOps {
 public:
  // One line for --dry-run: the device, and for a GPU its name and memory.
  virtual std::string describe() const { return name(); }
  // What records a whole training step as one graph (runtime.cuda_graph, models/step_capture.h);
  // null where the backend cannot (the CPU).
  virtual StepCapture* step_capture() { return nullptr; }
};

// The CPU backend (oneDNN primitives, OpenBLAS, OpenMP loops) with `settings`: one per process and
// settings, made on first use and never destroyed (ops, buffers and sync state made through it keep
// a reference for the process's life). The default one (fp32) also does the host arithmetic of
// host-staged syncs and servers. Throws std::invalid_argument, one line naming runtime.precision,
// for a precision this CPU cannot run (dnnl_precision.h).
Backend& cpu_backend(const BackendSettings& settings = {});

}  // namespace trainer::models
