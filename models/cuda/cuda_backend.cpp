#include "models/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cuda/cuda_check.h"
#include "models/cuda/cuda_device.h"
#include "models/cuda/cuda_step_capture.h"
#include "models/cuda/cudnn_ops.h"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

// Pieces of one scratch allocation, each at a multiple of 256 bytes (cudaMalloc's alignment), for
// ops that need several device arrays at once.
struct ScratchPlan {
  size_t bytes = 0;
  size_t add(size_t n) {
    const size_t at = bytes;
    bytes += (n + 255) / 256 * 256;
    return at;
  }
};

// The attention's host arrays as kernel parameters (host_ints.h): every utterance's length and the
// row -> utterance map (empty: the identity). Checked here, since a kernel reading past an
// utterance's keys would read another's, or past the buffer.
struct AttentionInts {
  HostInts lengths, row_utterance;
  AttentionInts(int64_t rows, int64_t steps, const int32_t* lengths_host, const int32_t* row_utterance_host) {
    int64_t utterances = rows;
    if (row_utterance_host) {
      row_utterance = host_ints(row_utterance_host, rows, "attention rows");
      utterances = 0;
      for (int64_t r = 0; r < rows; ++r) {
        if (row_utterance.v[r] < 0) throw std::invalid_argument("attention: a row of a negative utterance");
        utterances = std::max<int64_t>(utterances, row_utterance.v[r] + 1);
      }
    } else {
      row_utterance = host_ints(nullptr, 0, "attention rows");
    }
    lengths = host_ints(lengths_host, utterances, "attention lengths");
    for (int64_t u = 0; u < utterances; ++u)
      if (lengths.v[u] < 1 || lengths.v[u] > steps)
        throw std::invalid_argument("attention: utterance " + std::to_string(u) + " has length " +
                                    std::to_string(lengths.v[u]) + ", outside 1.." + std::to_string(steps));
  }
};

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
// The shared scratch's size from the second stream's making on (scratch()): 2M doubles of partials.
constexpr size_t kOverlapScratchBytes = size_t(16) << 20;

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) throw std::invalid_argument(std::string("cuBLAS gemm: ") + what + " out of int range");
  return static_cast<int>(v);
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int local_rank, const BackendSettings& settings)
      : settings_(settings),
        memory_(cuda_device(local_rank)),
        stream_(cuda_stream(local_rank)),
        description_(describe_cuda_device(local_rank)),
        cudnn_(memory_, stream_, settings) {
    check(cublasCreate(&cublas_), "cublasCreate");
    check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // FP32: CUBLAS_DEFAULT_MATH never uses TF32 tensor cores for SGEMM (that takes
    // CUBLAS_TF32_TENSOR_OP_MATH, runtime.precision = "tf32", or NVIDIA_TF32_OVERRIDE).
    check(cublasSetMathMode(cublas_, settings.precision == Precision::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                             : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
    // The handle's one workspace, ours, set before any capture (a step graph is recorded only after
    // eager steps, trainer/step/step_graph.h). Without it cuBLAS takes workspaces from its own pool: under
    // stream capture a new one for every capture, so each re-record grows memory (PyTorch #83461,
    // which gives every handle its own for that reason), and the pool's choice may differ between
    // eager and captured calls. The cuBLAS docs (Results reproducibility) name a user workspace per
    // handle as what keeps results bit-wise repeatable when more than one stream is active (ours
    // has two during an overlapped step). Set after cublasSetStream, which resets the workspace to
    // the default pool. The size is the cuBLAS docs' recommendation for Hopper (cublasSetWorkspace:
    // 32 MiB; 4 MiB elsewhere), which covers the smaller need of older GPUs.
    cublas_workspace_ = memory_.allocate(kCublasWorkspaceBytes);
    check(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes), "cublasSetWorkspace");
    check(cudaMallocHost(&host_result_, 2 * sizeof(double)), "cudaMallocHost");
  }
  ~CudaBackend() override {
    if (scratch_) {
      if (scratch_async_)
        cudaFreeAsync(scratch_, stream_);
      else
        memory_.free(scratch_);
    }
    cudaFreeHost(host_result_);
    cublasDestroy(cublas_);
    if (cublas_workspace_) memory_.free(cublas_workspace_);  // after the handle that uses it
  }

  // ---- DeviceMemory: the CUDA device's.
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return description_; }
  void* allocate(size_t bytes) override { return memory_.allocate(bytes); }
  void free(void* p) override { memory_.free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { memory_.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { memory_.copy_to_host(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { memory_.fill(n, value, y); }
  void synchronize() override { memory_.synchronize(); }
  void* stream_handle() override { return stream_; }  // NCCL enqueues on it (comm/cuda/nccl_communicator.h)
  // The second stream is made before the first overlapped step (comm/sync/methods/dense/dense.cpp), so this is
  // where the shared scratch is sized for them (see scratch()).
  std::unique_ptr<DeviceStream> make_stream() override {
    std::unique_ptr<DeviceStream> stream = memory_.make_stream();
    if (stream && !second_stream_) {
      second_stream_ = true;
      int pools = 0;
      check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_of_stream()),
            "cudaDeviceGetAttribute (memory pools)");
      stream_ordered_scratch_ = pools != 0;
      // Sized now, and made stream-ordered now (freeing the old one waits for the device once,
      // here, before any collective is in flight).
      const size_t bytes = std::max(scratch_bytes_, kOverlapScratchBytes);
      if (stream_ordered_scratch_ && scratch_) {
        memory_.free(scratch_);
        scratch_ = nullptr;
        scratch_bytes_ = 0;
      }
      scratch(bytes);
    }
    return stream;
  }

  Layout activation_layout(int64_t) const override { return Layout::kChannelsLast; }

  // Made on first use: a run that never captures allocates nothing for it.
  StepCapture* step_capture() override {
    if (!capture_) capture_ = std::make_unique<CudaStepCapture>(memory_, stream_);
    return capture_.get();
  }

  std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) override { return make_cudnn_conv(g, cudnn_); }
  std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) override {
    return make_batchnorm_op(g, memory_, stream_);
  }
  std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) override { return make_cudnn_pool(g, cudnn_); }
  std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g) override { return make_cudnn_lstm(g, cudnn_); }

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same buffers read as
    // their transposes, so swap the operands (and m with n) and keep each one's transpose flag.
    check(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                      to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b, to_int(ldb, "ldb"), a,
                      to_int(lda, "lda"), &beta, c, to_int(ldc, "ldc")),
          "cublasSgemm");
  }

  // runtime.precision = bf16 (cuda_backend.h): op(A) and op(B) rounded to packed bf16 copies, multiplied
  // by cuBLAS with fp32 accumulation into the fp32 C.
  void layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    if (settings_.precision != Precision::kBf16) {
      gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    // Each operand as stored: rows of the row-major matrix (op(A) is m x k, so A is k x m when transposed).
    const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    ScratchPlan plan;
    const size_t a_at = plan.add(sizeof(uint16_t) * a_rows * a_cols);
    const size_t b_at = plan.add(sizeof(uint16_t) * b_rows * b_cols);
    char* base = static_cast<char*>(scratch(plan.bytes));
    auto* a16 = reinterpret_cast<uint16_t*>(base + a_at);
    auto* b16 = reinterpret_cast<uint16_t*>(base + b_at);
    check(launch_to_bf16_2d(a_rows, a_cols, a, lda, a16, stream_), "layer_gemm: A to bf16");
    check(launch_to_bf16_2d(b_rows, b_cols, b, ldb, b16, stream_), "layer_gemm: B to bf16");
    // Row-major as column-major transposes, as in gemm(); the copies are packed (ld = their row length).
    check(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                       to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b16, CUDA_R_16BF,
                       to_int(b_cols, "ldb"), a16, CUDA_R_16BF, to_int(a_cols, "lda"), &beta, c, CUDA_R_32F,
                       to_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
  }

  void broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y) override {
    check(launch_broadcast_rows(rows, cols, bias, y, stream_), "broadcast_rows");
  }
  void sum_rows(int64_t rows, int64_t cols, const float* dy, float* db) override {
    auto* partial = static_cast<double*>(scratch(sizeof(double) * column_sum_partials(rows, cols)));
    check(launch_sum_rows(rows, cols, dy, db, partial, stream_), "sum_rows");
  }
  void relu_forward(int64_t n, const float* x, float* y) override {
    check(launch_relu_forward(n, x, y, stream_), "relu_forward");
  }
  void relu_backward(int64_t n, const float* y, const float* dy, float* dx) override {
    check(launch_relu_backward(n, y, dy, dx, stream_), "relu_backward");
  }
  void add(int64_t n, const float* a, const float* b, float* y) override {
    check(launch_add(n, a, b, y, stream_), "add");
  }
  void copy(int64_t n, const float* x, float* y) override {
    if (x != y && n > 0)
      check(cudaMemcpyAsync(y, x, sizeof(float) * n, cudaMemcpyDeviceToDevice, stream_), "copy (device to device)");
  }

  void shortcut_a_forward(const Tensor& x, int64_t stride, int64_t pad, Tensor& y) override {
    check(launch_shortcut_a_forward(x.data, dims_of(x), stride, pad, y.data, dims_of(y), stream_), "shortcut_a_forward");
  }
  void shortcut_a_backward(const Tensor& dy, int64_t stride, int64_t pad, Tensor& dx) override {
    check(launch_shortcut_a_backward(dy.data, dims_of(dy), stride, pad, dx.data, dims_of(dx), stream_),
          "shortcut_a_backward");
  }
  // Every CUDA activation is channels-last, so a conversion is a copy.
  void convert_layout(const Tensor& x, Tensor& y) override {
    if (x.layout != y.layout || x.shape != y.shape)
      throw std::logic_error("convert_layout: the CUDA backend keeps every activation channels-last");
    copy(x.numel(), x.data, y.data);
  }
  void to_nchw(const Tensor& x, float* y) override { check(launch_to_nchw(x.data, dims_of(x), y, stream_), "to_nchw"); }
  void from_nchw(const float* x, Tensor& y) override {
    check(launch_from_nchw(x, dims_of(y), y.data, stream_), "from_nchw");
  }

  double softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits, const int32_t* labels,
                               float smoothing, float* dlogits, int64_t* correct) override {
    // Scratch: the result (2 doubles), each row's loss (doubles), each row's hit (ints).
    auto* result = static_cast<double*>(scratch(sizeof(double) * (2 + batch) + sizeof(int32_t) * batch));
    double* row_loss = result + 2;
    auto* row_hit = reinterpret_cast<int32_t*>(row_loss + batch);
    check(launch_softmax_cross_entropy(batch, classes, logits, labels, smoothing, dlogits, row_loss, row_hit, result,
                                       stream_),
          "softmax_cross_entropy");
    // A captured step (models/step_capture.h): the {sum, correct} stay on the device for the
    // host to read after the step; the caller's values mean nothing.
    if (capture_ && capture_->deferred_loss()) {
      check(cudaMemcpyAsync(capture_->control()->loss, result, 2 * sizeof(double), cudaMemcpyDeviceToDevice, stream_),
            "softmax_cross_entropy: the loss into the step's control block");
      if (correct) *correct = 0;
      return 0.0;
    }
    const double* host = read_result(result, 2);
    if (correct) *correct = static_cast<int64_t>(host[1]);
    return batch > 0 ? host[0] / batch : 0.0;
  }

  // ---- Sequences: the speech models' ops (sequence.cu, lookahead.cu, ctc.cu). Lengths stay host
  // arrays: each launch takes them by value (HostInts).
  void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                       const float* src, int64_t src_ld, float* dst, int64_t dst_ld) override {
    const HostInts l = host_ints(lengths, batch, "sequence_gather");
    // Reversed, a length past T would read rows that do not exist (the CPU's loop would too); on a
    // GPU that is a fault that ends the process's CUDA context, so say so here instead.
    if (reverse)
      for (int64_t n = 0; n < batch; ++n)
        if (l.v[n] > steps)
          throw std::invalid_argument("CUDA backend: sequence_gather: length " + std::to_string(l.v[n]) +
                                      " of sequence " + std::to_string(n) + " exceeds the " + std::to_string(steps) +
                                      " steps");
    check(launch_sequence_gather(steps, batch, cols, l, reverse, src, src_ld, dst, dst_ld, stream_),
          "sequence_gather");
  }
  void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                      float* packed) override {
    check(launch_pack_sequences(steps, batch, cols, host_ints(lengths, batch, "pack_sequences"), x, packed, stream_),
          "pack_sequences");
  }
  void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* packed,
                        float* x) override {
    check(launch_unpack_sequences(steps, batch, cols, host_ints(lengths, batch, "unpack_sequences"), packed, x,
                                  stream_),
          "unpack_sequences");
  }
  void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y) override {
    check(launch_hardtanh_forward(n, lo, hi, x, y, stream_), "hardtanh_forward");
  }
  void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) override {
    check(launch_hardtanh_backward(n, lo, hi, y, dy, dx, stream_), "hardtanh_backward");
  }
  void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                         const float* w, float* y) override {
    check(launch_lookahead_forward(steps, batch, channels, context, x, w, y, stream_), "lookahead_forward");
  }
  void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                          const float* w, const float* dy, float* dx, float* dw) override {
    auto* partial =
        static_cast<double*>(scratch(sizeof(double) * lookahead_dw_partials(steps, batch, channels, context)));
    check(launch_lookahead_backward(steps, batch, channels, context, x, w, dy, dx, dw, partial, stream_),
          "lookahead_backward");
  }
  void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
                const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
                float* dlogits) override {
    if (batch <= 0) return;
    const HostInts f = host_ints(frames, batch, "ctc_loss"), ll = host_ints(label_lengths, batch, "ctc_loss");
    // The kernels index by these without bounds (CtcLoss checks them before the CPU's loops do).
    if (classes < 1) throw std::invalid_argument("CUDA backend: ctc_loss: no classes");
    int64_t total_labels = 0;
    for (int64_t n = 0; n < batch; ++n) {
      if (ll.v[n] < 0) throw std::invalid_argument("CUDA backend: ctc_loss: negative label length");
      total_labels += ll.v[n];
    }
    for (int64_t i = 0; i < total_labels; ++i)
      if (labels[i] < 0 || labels[i] >= classes)
        throw std::invalid_argument("CUDA backend: ctc_loss: label " + std::to_string(labels[i]) + " outside [0, " +
                                    std::to_string(classes) + ")");
    // One scratch, carved: log-probabilities, alpha, beta (with a gradient), losses, the labels.
    const int64_t states = ctc_states(steps, batch, f, ll);
    ScratchPlan plan;
    const size_t lp_at = plan.add(sizeof(double) * steps * batch * classes);
    const size_t alpha_at = plan.add(sizeof(double) * states);
    const size_t beta_at = plan.add(dlogits ? sizeof(double) * states : 0);
    const size_t losses_at = plan.add(sizeof(double) * batch);
    const size_t labels_at = plan.add(sizeof(int32_t) * total_labels);
    char* base = static_cast<char*>(scratch(plan.bytes));
    auto* device_labels = reinterpret_cast<int32_t*>(base + labels_at);
    auto* device_losses = reinterpret_cast<double*>(base + losses_at);
    // Pageable and asynchronous: the host labels are staged before this returns, and the copy
    // runs in stream order before the kernels.
    copy_to_device(device_labels, labels, sizeof(int32_t) * total_labels);
    check(launch_ctc_loss(steps, batch, classes, logits, f, device_labels, ll, grad_scale,
                          reinterpret_cast<double*>(base + lp_at), reinterpret_cast<double*>(base + alpha_at),
                          reinterpret_cast<double*>(base + beta_at), device_losses, dlogits, stream_),
          "ctc_loss");
    copy_to_host(losses, device_losses, sizeof(double) * batch);
    synchronize();
  }
  void image_to_sequence(const Tensor& x, float* y) override {
    check(launch_image_to_sequence(x.data, dims_of(x), y, stream_), "image_to_sequence");
  }
  void sequence_to_image(const float* y, Tensor& x) override {
    check(launch_sequence_to_image(y, dims_of(x), x.data, stream_), "sequence_to_image");
  }
  void mask_width(const Tensor& x, const int32_t* lengths) override {
    check(launch_mask_width(x.data, dims_of(x), host_ints(lengths, x.dim(0), "mask_width"), stream_), "mask_width");
  }
  void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) override {
    check(launch_transpose(batch, rows, cols, x, y, stream_), "transpose");
  }

  // ---- Rows and the attention speller (speller.cu, attention.cu).
  void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y) override {
    check(launch_swap_axes(outer, a, b, cols, x, y, stream_), "swap_axes");
  }
  void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) override {
    if (rows <= 0 || cols <= 0) return;
    if (ldx < cols || ldy < cols) throw std::invalid_argument("copy_2d: a leading dimension below the row length");
    check(cudaMemcpy2DAsync(y, sizeof(float) * ldy, x, sizeof(float) * ldx, sizeof(float) * cols,
                            static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_),
          "copy_2d (cudaMemcpy2DAsync)");
  }
  void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    check(launch_gather_rows(count, cols, index, x, y, stream_), "gather_rows");
  }
  void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y) override {
    check(launch_scatter_rows(count, cols, index, x, y, stream_), "scatter_rows");
  }
  void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y,
                         int64_t ldy) override {
    check(launch_embedding_forward(rows, dim, tokens, table, y, ldy, stream_), "embedding_forward");
  }
  void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                          float* dtable) override {
    check(launch_embedding_backward(rows, dim, tokens, dy, ldy, dtable, stream_), "embedding_backward");
  }
  void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                     const int32_t* truth, int32_t* tokens) override {
    check(launch_select_tokens(rows, classes, logits, use_model, truth, tokens, stream_), "select_tokens");
  }
  void lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c, float* h,
                         float* tanh_c) override {
    check(launch_lstm_cell_forward(rows, hidden, gates, c_prev, c, h, tanh_c, stream_), "lstm_cell_forward");
  }
  void lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev, const float* tanh_c,
                          const float* dh, float* dc, float* dgates) override {
    check(launch_lstm_cell_backward(rows, hidden, gates, c_prev, tanh_c, dh, dc, dgates, stream_),
          "lstm_cell_backward");
  }
  void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                         const int32_t* row_utterance, const float* query, const float* keys, const float* values,
                         float* alpha, float* context, int64_t ldc) override {
    const AttentionInts ints(rows, steps, lengths, row_utterance);
    check(launch_attention_forward(rows, steps, dim, cols, ints.lengths, ints.row_utterance, query, keys, values,
                                   alpha, context, ldc, stream_),
          "attention_forward");
  }
  void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                          const int32_t* row_utterance, const float* keys, const float* values, const float* alpha,
                          const float* dcontext, float* denergy, float* dquery) override {
    const AttentionInts ints(rows, steps, lengths, row_utterance);
    check(launch_attention_backward(rows, steps, dim, cols, ints.lengths, ints.row_utterance, keys, values, alpha,
                                    dcontext, denergy, dquery, stream_),
          "attention_backward");
  }

  // ---- Optimizer arithmetic (optim_kernels.cu, reduce.cu).
  void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum) override {
    check(launch_sgd_update(n, u, params, grads, momentum, stream_), "sgd_update");
  }
  void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v) override {
    check(launch_adam_update(n, u, params, grads, m, v, stream_), "adam_update");
  }
  double sum_of_squares(int64_t n, const float* x) override {
    auto* result = static_cast<double*>(scratch(sizeof(double) * (1 + sum_of_squares_partials(n))));
    check(launch_sum_of_squares(n, x, result + 1, result, stream_), "sum_of_squares");
    return read_result(result, 1)[0];
  }
  void scale(int64_t n, float alpha, float* x) override { check(launch_scale(n, alpha, x, stream_), "scale"); }
  void to_half(HalfFormat format, int64_t n, const float* x, float scale, uint16_t* y) override {
    check(launch_to_half(format, n, x, scale, y, stream_), "to_half");
  }
  void from_half(HalfFormat format, int64_t n, const uint16_t* x, float* y) override {
    check(launch_from_half(format, n, x, y, stream_), "from_half");
  }
  void sum_of_squares_into(int64_t n, const float* x, double* out) override {
    // The partials in the shared scratch: ops run in stream order, and nothing waits here.
    auto* partial = static_cast<double*>(scratch(sizeof(double) * sum_of_squares_partials(n)));
    check(launch_sum_of_squares(n, x, partial, out, stream_), "sum_of_squares_into");
  }
  void batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                const float* batch_var, float* running_mean, float* running_var) override {
    check(launch_batchnorm_update_running(channels, momentum, unbias, batch_mean, batch_var, running_mean,
                                          running_var, stream_),
          "batchnorm_update_running");
  }

  // ---- Sparse gradient sync (sparse.cu).
  void magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask, uint32_t prefix,
                           int shift, int32_t* histogram) override {
    check(launch_magnitude_histogram(n, grad, acc, min_key, mask, prefix, shift, histogram, stream_),
          "magnitude_histogram");
  }
  int64_t select_at_least(int64_t n, const float* grad, float* acc, float t, int32_t* index, float* value,
                          int64_t capacity) override {
    const int64_t blocks = select_blocks(n);
    auto* counts = static_cast<int64_t*>(scratch(sizeof(int64_t) * (blocks + 1)));
    check(launch_count_at_least(n, grad, acc, t, counts, stream_), "select_at_least (count)");
    const int64_t total = read_count(counts + blocks);
    if (total > 0 && total <= capacity)
      check(launch_write_at_least(n, acc, t, counts, index, value, stream_), "select_at_least (write)");
    return total;
  }
  void accumulate_moments(int64_t n, const float* grad, float* acc, double* sums) override {
    auto* result = static_cast<double*>(scratch(sizeof(double) * (2 + 2 * moments_partials(n))));
    check(launch_accumulate_moments(n, grad, acc, result + 2, result, stream_), "accumulate_moments");
    const double* host = read_result(result, 2);
    sums[0] = host[0];
    sums[1] = host[1];
  }
  void sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                       float* y) override {
    check(launch_sparse_to_dense(n, count, index, value, divisor, y, stream_), "sparse_to_dense");
  }
  void scatter_fill(int64_t count, const int32_t* index, float value, float* y) override {
    check(launch_scatter_fill(count, index, value, y, stream_), "scatter_fill");
  }
  void momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) override {
    check(launch_momentum_correction(n, momentum, nesterov, velocity, grad, stream_), "momentum_correction");
  }

  // ---- Low-rank gradient sync (low_rank.cu, elementwise.cu).
  void orthonormalize_columns(const std::vector<TallMatrix>& batch) override {
    if (batch.empty()) return;
    // The descriptors go up with the launch (a copy from pageable memory returns once staged).
    auto* on_device = static_cast<TallMatrix*>(scratch(sizeof(TallMatrix) * batch.size()));
    copy_to_device(on_device, batch.data(), sizeof(TallMatrix) * batch.size());
    check(launch_orthonormalize_columns(static_cast<int64_t>(batch.size()), on_device, stream_),
          "orthonormalize_columns");
  }
  void subtract(int64_t n, const float* a, const float* b, float* y) override {
    check(launch_subtract(n, a, b, y, stream_), "subtract");
  }
  void lerp(int64_t n, const float* start, float weight, float* y) override {
    check(launch_lerp(n, start, weight, y, stream_), "lerp");
  }

  // ---- Low-bit outer gradients (low_bit.cu).
  void quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks, uint8_t* chunk) override {
    check(launch_quantize_blocks(format, x, count, blocks, chunk, stream_), "quantize_blocks");
  }
  void sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                            int64_t blocks, float* acc) override {
    check(launch_sum_quantized_blocks(format, received, chunk_bytes, ranks, blocks, acc, stream_),
          "sum_quantized_blocks");
  }
  void dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                         float* out) override {
    check(launch_dequantize_blocks(format, chunk, blocks, count, out, stream_), "dequantize_blocks");
  }

 private:
  // Device scratch for reductions, grown only. Ops run in stream order, so one scratch serves them
  // all. Before a second stream exists a grown scratch replaces the old one through cudaFree, which
  // waits for the whole device, so no enqueued op still uses the old one. Once one exists
  // (make_stream: sync.overlap's collectives run there during backward) that wait would also wait
  // for the collectives in flight, stalling the overlap, and a device-wide wait while NCCL kernels
  // run is what NCCL's users are warned off (a rank blocked in cudaFree while its peer's collective
  // waits for it). So make_stream sizes the scratch before the first overlapped step
  // (kOverlapScratchBytes: the reductions' partials of backward's ops for all but the largest
  // shapes), and a larger need after that grows it stream-ordered on the compute stream
  // (cudaFreeAsync after the old one's last user there, cudaMallocAsync: the CUDA programming
  // guide's stream-ordered allocator), which waits for nothing; the second stream never reads it.
  // Never inside a capture: a recorded step replays with the pointers it was recorded with, and its
  // eager warmup steps have grown the scratch already.
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) grow_scratch(bytes);
    return scratch_;
  }
  void grow_scratch(size_t bytes) {
    if (!stream_ordered_scratch_) {
      if (scratch_) memory_.free(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      scratch_ = memory_.allocate(bytes);
      scratch_bytes_ = bytes;
      return;
    }
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone)
      throw std::logic_error("CUDA backend: the scratch would grow to " + std::to_string(bytes) +
                             " bytes inside a recorded step (its eager warmup steps should have grown it)");
    if (scratch_) check(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync (scratch)");  // make_stream's or later
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    check(cudaMallocAsync(&scratch_, bytes, stream_), "cudaMallocAsync (scratch)");
    scratch_async_ = true;
    scratch_bytes_ = bytes;
  }
  int device_of_stream() const {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");  // the backend's device is the thread's current one
    return device;
  }
  // Copies `n` (at most 2) doubles to pinned host memory and waits for them.
  const double* read_result(const double* device, int n) {
    copy_to_host(host_result_, device, sizeof(double) * n);
    synchronize();
    return host_result_;
  }
  // The same for one int64 (a count).
  int64_t read_count(const int64_t* device) {
    copy_to_host(host_result_, device, sizeof(int64_t));
    synchronize();
    int64_t count;
    std::memcpy(&count, host_result_, sizeof count);
    return count;
  }

  const BackendSettings settings_;
  DeviceMemory& memory_;
  cudaStream_t stream_;
  std::string description_;
  CudnnContext cudnn_;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;  // the handle's (cublasSetWorkspace), for its whole life
  double* host_result_ = nullptr;
  std::unique_ptr<CudaStepCapture> capture_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool second_stream_ = false;           // make_stream has made one
  bool stream_ordered_scratch_ = false;  // from then on the scratch grows stream-ordered (scratch())
  bool scratch_async_ = false;           // scratch_ came from cudaMallocAsync
};

}  // namespace

Backend& cuda_backend(int local_rank, const BackendSettings& settings) {
  // Never destroyed: at exit the device (another function's static) may already be gone, and the
  // handles and buffers go with the process anyway.
  struct Made {
    int local_rank;
    BackendSettings settings;
    CudaBackend* backend;
  };
  static std::mutex mutex;
  static auto* made = new std::vector<Made>;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Made& m : *made)
    if (m.local_rank == local_rank && m.settings == settings) return *m.backend;
  made->push_back({local_rank, settings, new CudaBackend(local_rank, settings)});
  return *made->back().backend;
}

}  // namespace trainer::models::cuda
