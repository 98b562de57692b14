// The whole LSTM (LstmOp, backend.h) as one cuDNN 9 RNN: cudnnRNNForward, cudnnRNNBackwardData_v8
// and cudnnRNNBackwardWeights_v8 over every layer and direction at once.
//
// Descriptor choices: the standard algorithm (the persistent ones restrict sizes, and
// PERSIST_STATIC_SMALL_H takes no variable lengths); PyTorch's cell (CUDNN_LSTM, two biases,
// CUDNN_LINEAR_INPUT, no projection: projSize = hidden); FP32 data and math, with FMA math, which
// keeps cuDNN off TF32 tensor cores, unless runtime.precision = "tf32" (then CUDNN_DEFAULT_MATH, as
// the convolutions: TF32 allowed; ALLOW_CONVERSION would also allow FP16, which "tf32" does not
// promise); a dropout descriptor of probability 0 without RNG state (the v8 descriptor takes one;
// with 0 no state is read). Batches are padded, time-major: CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
// with the batch's lengths, which cuDNN accepts only with CUDNN_RNN_PADDED_IO_ENABLED. cuDNN runs
// each sequence over its own steps, the reverse direction from the sequence's own last step, which
// is the contract. Zero initial states: hx, cx null (the descriptors are still required).
//
// Shapes: one op serves every (T, N) (the layer makes one per LSTM): the RNN descriptor and the
// weight spaces depend on the sizes only, and the data and state descriptors, which carry T, N and
// the lengths, are set per call (host-side calls, no allocation). The workspace, the reserve space
// and the device lengths grow to the largest batch seen; a speech run meets its largest batch
// within its first steps, after which nothing is allocated or freed (freeing waits for the device).
//
// Lengths: the data descriptors carry them as a host array (seqLengthArray), and the kernels read a
// device copy (devSeqLengths) asynchronously, possibly after the call returns, so the op owns that
// device array and uploads it whenever the lengths change (stream-ordered: a copy from pageable host
// memory is staged before cudaMemcpyAsync returns). cuDNN's kernels fail on empty sequences (jax
// issue 17966: any zero length in backward), so a length of 0 is refused here.
//
// Padding: y's padding rows are written by cuDNN with the y descriptor's paddingFill (0). For dx the
// documentation promises nothing (paddingFill is documented for outputs of the forward), so backward
// zeroes dx's padding rows itself: one strided cudaMemset2DAsync per sequence shorter than T.
//
// Weights: the parameters stay in PyTorch's layout in the flat parameter buffer (so checkpoints,
// gradient buckets and the optimizer see the same tensors on every device), and cuDNN's weight
// space is an opaque buffer whose layout cuDNN chooses (order, alignment). So each forward copies
// the parameters into the weight space, and each backward zeroes the gradient space (backward
// weights only adds: CUDNN_WGRAD_MODE_ADD is the only mode) and copies the gradients out. The
// places come from cudnnGetRNNWeightParams once per op: per (layer, direction) and gate, linLayerID
// 0-3 are W_ih's and b_ih's gates i, f, g, o and 4-7 W_hh's and b_hh's, PyTorch's gate order. Where
// a tensor's four gate blocks lie back to back in the weight space (cuDNN's layout, which PyTorch's
// own cuDNN path relies on) the copy is one cudaMemcpyAsync per tensor, else one per gate.
// Cost per step: about five times the LSTM's parameter bytes of memory traffic (the copy in reads
// and writes them, zeroing the gradient space writes them, the copy out reads and writes them):
// DeepSpeech's five LSTMs hold 27.3 M parameters (109 MB), so some 545 MB, about 0.2 ms at an
// H100's 3.35 TB/s, small next to the recurrence itself. Pointing cuDNN at the flat buffer instead would tie the
// parameter layout (and so every checkpoint) to one cuDNN version's weight-space layout and its
// alignment, and backward would still need its own zeroed gradient space.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cuda/cuda_backend.h"
#include "models/cuda/cuda_check.h"
#include "models/cuda/cudnn_ops.h"

namespace trainer::models::cuda {
namespace {

int to_int(int64_t v, const char* what) {
  if (v <= 0 || v > INT32_MAX) throw std::invalid_argument(std::string("cuDNN LSTM: ") + what + " out of range");
  return static_cast<int>(v);
}

// One contiguous run of floats copied between a parameter tensor and the weight space.
struct Piece {
  int tensor = 0;  // 0 w_ih, 1 w_hh, 2 b_ih, 3 b_hh
  int64_t index = 0;          // layer * D + direction (cuDNN's pseudo-layer)
  int64_t param_offset = 0;   // floats into the parameter tensor
  int64_t space_offset = 0;   // floats into the weight space
  int64_t count = 0;
};

class CudnnLstm final : public LstmOp {
 public:
  CudnnLstm(const LstmGeometry& g, CudnnContext& context) : g_(g), ctx_(context) {
    const int H = to_int(g.hidden, "hidden"), L = to_int(g.layers, "layers");
    cudnnHandle_t h = ctx_.handle();
    check(cudnnCreateDropoutDescriptor(&dropout_), "cudnnCreateDropoutDescriptor");
    check(cudnnSetDropoutDescriptor(dropout_, h, 0.f, nullptr, 0, 0), "cudnnSetDropoutDescriptor (no dropout)");
    check(cudnnCreateRNNDescriptor(&rnn_), "cudnnCreateRNNDescriptor");
    check(cudnnSetRNNDescriptor_v8(rnn_, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS,
                                   g.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT,
                                   CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                   ctx_.tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH, to_int(g.input, "input"), H,
                                   H, L, dropout_, CUDNN_RNN_PADDED_IO_ENABLED),
          "cudnnSetRNNDescriptor_v8");
    check(cudnnCreateRNNDataDescriptor(&x_), "cudnnCreateRNNDataDescriptor");
    check(cudnnCreateRNNDataDescriptor(&y_), "cudnnCreateRNNDataDescriptor");
    check(cudnnCreateTensorDescriptor(&state_), "cudnnCreateTensorDescriptor");

    check(cudnnGetRNNWeightSpaceSize(h, rnn_, &weight_bytes_), "cudnnGetRNNWeightSpaceSize");
    weights_ = static_cast<float*>(ctx_.memory().allocate(weight_bytes_));
    dweights_ = static_cast<float*>(ctx_.memory().allocate(weight_bytes_));
    map_weights();
  }

  ~CudnnLstm() override {
    DeviceMemory& m = ctx_.memory();
    for (void* p : {static_cast<void*>(weights_), static_cast<void*>(dweights_), static_cast<void*>(dev_lengths_),
                    reserve_})
      if (p) m.free(p);
    cudnnDestroyTensorDescriptor(state_);
    cudnnDestroyRNNDataDescriptor(y_);
    cudnnDestroyRNNDataDescriptor(x_);
    cudnnDestroyRNNDescriptor(rnn_);
    cudnnDestroyDropoutDescriptor(dropout_);
  }

  void forward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w, float* y,
               bool training) override {
    check_count(w.w_ih.size(), w.w_hh.size(), w.b_ih.size(), w.b_hh.size(), "weights");
    describe(steps, batch, lengths);
    cudnnHandle_t h = ctx_.handle();
    const cudnnForwardMode_t mode = training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
    size_t work = 0, reserve = 0;
    check(cudnnGetRNNTempSpaceSizes(h, rnn_, mode, x_, &work, &reserve),
          "cudnnGetRNNTempSpaceSizes");
    ctx_.reserve_workspace(work);
    if (training) grow_reserve(reserve);

    const std::vector<const float*>* tensors[4] = {&w.w_ih, &w.w_hh, &w.b_ih, &w.b_hh};
    for (const Piece& p : pieces_)
      copy(weights_ + p.space_offset, (*tensors[p.tensor])[p.index] + p.param_offset, p.count);
    // The reserve space of a training forward carries its activations to backward; inference
    // neither needs nor touches it, so an evaluation forward in between leaves it intact.
    check(cudnnRNNForward(h, rnn_, mode, dev_lengths_, x_, x, y_, y, state_, nullptr, nullptr, state_, nullptr, nullptr,
                          weight_bytes_, weights_, ctx_.workspace_bytes(), ctx_.workspace(),
                          training ? reserve_bytes_ : 0, training ? reserve_ : nullptr),
          "cudnnRNNForward");
    if (training) trained_ = true;
  }

  void backward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w,
                const float* y, const float* dy, float* dx, const LstmGradients& grads) override {
    check_count(w.w_ih.size(), w.w_hh.size(), w.b_ih.size(), w.b_hh.size(), "weights");
    check_count(grads.w_ih.size(), grads.w_hh.size(), grads.b_ih.size(), grads.b_hh.size(), "gradients");
    if (!trained_) throw std::logic_error("cuDNN LSTM: backward without a training forward before it");
    trained_ = false;  // backward data rewrites the reserve space: one backward per training forward
    describe(steps, batch, lengths);  // the forward's (an evaluation forward may have changed the descriptors)
    cudnnHandle_t h = ctx_.handle();
    // The weight space still holds the forward's weights, which the contract says are unchanged.
    check(cudnnRNNBackwardData_v8(h, rnn_, dev_lengths_, y_, y, dy, x_, dx, state_, nullptr, nullptr, nullptr, state_,
                                  nullptr, nullptr, nullptr, weight_bytes_, weights_, ctx_.workspace_bytes(),
                                  ctx_.workspace(), reserve_bytes_, reserve_),
          "cudnnRNNBackwardData_v8");
    zero_padding(dx, g_.input);
    // After backward data, which leaves in the reserve space what backward weights reads.
    check(cudaMemsetAsync(dweights_, 0, weight_bytes_, ctx_.stream()), "cudaMemsetAsync (LSTM weight gradients)");
    check(cudnnRNNBackwardWeights_v8(h, rnn_, CUDNN_WGRAD_MODE_ADD, dev_lengths_, x_, x, state_, nullptr, y_, y,
                                     weight_bytes_, dweights_, ctx_.workspace_bytes(), ctx_.workspace(),
                                     reserve_bytes_, reserve_),
          "cudnnRNNBackwardWeights_v8");
    const std::vector<float*>* tensors[4] = {&grads.w_ih, &grads.w_hh, &grads.b_ih, &grads.b_hh};
    for (const Piece& p : pieces_)
      if (p.tensor != 3) copy((*tensors[p.tensor])[p.index] + p.param_offset, dweights_ + p.space_offset, p.count);
    // Both biases enter every gate's sum the same way, so their gradients are equal; b_ih's is
    // copied to b_hh so they are equal to the bit, as the contract says (and as on the CPU).
    for (size_t i = 0; i < grads.b_hh.size(); ++i) copy(grads.b_hh[i], grads.b_ih[i], 4 * g_.hidden);
  }

 private:
  void copy(float* dst, const float* src, int64_t n) {
    check(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice, ctx_.stream()),
          "cudaMemcpyAsync (LSTM weights)");
  }

  void check_count(size_t a, size_t b, size_t c, size_t d, const char* what) const {
    const size_t n = static_cast<size_t>(g_.layers * g_.directions());
    if (a != n || b != n || c != n || d != n)
      throw std::invalid_argument(std::string("cuDNN LSTM: ") + what + " for " + std::to_string(n) +
                                  " (layer, direction) pairs expected");
  }

  // Sets the data and state descriptors and the device lengths to this batch when it differs from
  // the last one described.
  void describe(int64_t steps, int64_t batch, const int32_t* lengths) {
    const int64_t T = to_int(steps, "sequence length"), N = to_int(batch, "batch");
    for (int64_t n = 0; n < N; ++n)
      if (lengths[n] < 1 || lengths[n] > T)
        throw std::invalid_argument("cuDNN LSTM: sequence " + std::to_string(n) + " has length " +
                                    std::to_string(lengths[n]) + ", outside [1, " + std::to_string(T) +
                                    "] (cuDNN's RNN kernels fail on empty sequences)");
    if (T == steps_ && described_.size() == static_cast<size_t>(N) &&
        std::equal(described_.begin(), described_.end(), lengths))
      return;
    steps_ = T;
    described_.assign(lengths, lengths + N);
    const int D = static_cast<int>(g_.directions());
    // Initial/final hidden and cell states {L*D, N, H}, fully packed; one descriptor serves both
    // (no projection, so they have the same shape). The states themselves are null: zero.
    const int H = static_cast<int>(g_.hidden), dims[3] = {static_cast<int>(g_.layers) * D, static_cast<int>(N), H},
              strides[3] = {static_cast<int>(N) * H, H, 1};
    check(cudnnSetTensorNdDescriptor(state_, CUDNN_DATA_FLOAT, 3, dims, strides), "LSTM state descriptor");
    // paddingFill is read when the descriptor describes an output: y in forward (dx: see above).
    check(cudnnSetRNNDataDescriptor(x_, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                    static_cast<int>(T), static_cast<int>(N), static_cast<int>(g_.input),
                                    described_.data(), &padding_fill_),
          "cudnnSetRNNDataDescriptor (x)");
    check(cudnnSetRNNDataDescriptor(y_, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                    static_cast<int>(T), static_cast<int>(N), static_cast<int>(D * g_.hidden),
                                    described_.data(), &padding_fill_),
          "cudnnSetRNNDataDescriptor (y)");
    if (N > dev_lengths_capacity_) {  // freeing waits for the device: nothing still reads the old array
      if (dev_lengths_) ctx_.memory().free(dev_lengths_);
      dev_lengths_ = nullptr;
      dev_lengths_ = static_cast<int32_t*>(ctx_.memory().allocate(sizeof(int32_t) * N));
      dev_lengths_capacity_ = N;
    }
    ctx_.memory().copy_to_device(dev_lengths_, described_.data(), sizeof(int32_t) * N);
  }

  // Rows t >= lengths[n] of sequence n in a {T, N, cols} tensor: one strided 2-D fill each.
  void zero_padding(float* data, int64_t cols) {
    const int64_t T = steps_, N = static_cast<int64_t>(described_.size());
    for (int64_t n = 0; n < N; ++n) {
      const int64_t length = described_[n];
      if (length == T) continue;
      check(cudaMemset2DAsync(data + (length * N + n) * cols, sizeof(float) * N * cols, 0, sizeof(float) * cols,
                              static_cast<size_t>(T - length), ctx_.stream()),
            "cudaMemset2DAsync (LSTM input gradient padding)");
    }
  }

  // Freeing device memory waits for the device, so nothing enqueued still uses the old reserve.
  void grow_reserve(size_t bytes) {
    if (bytes <= reserve_bytes_) return;
    if (reserve_) ctx_.memory().free(reserve_);
    reserve_ = nullptr;
    reserve_bytes_ = 0;
    reserve_ = ctx_.memory().allocate(bytes);
    reserve_bytes_ = bytes;
  }

  // Where every gate block of every parameter lives in the weight space (pieces_), merged into one
  // piece per tensor where the gate blocks are back to back in PyTorch's order.
  void map_weights() {
    cudnnTensorDescriptor_t m = nullptr, b = nullptr;
    check(cudnnCreateTensorDescriptor(&m), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&b), "cudnnCreateTensorDescriptor");
    try {
      const int64_t H = g_.hidden, D = g_.directions();
      for (int64_t index = 0; index < g_.layers * D; ++index) {
        const int64_t in = g_.layer_input(index / D);
        for (int lin = 0; lin < 8; ++lin) {
          void* m_addr = nullptr;
          void* b_addr = nullptr;
          check(cudnnGetRNNWeightParams(ctx_.handle(), rnn_, static_cast<int32_t>(index), weight_bytes_, weights_, lin, m,
                                        &m_addr, b, &b_addr),
                "cudnnGetRNNWeightParams");
          const int64_t cols = lin < 4 ? in : H, gate = lin % 4;
          // One gate's rows of PyTorch's {4H, cols} matrix, and of its {4H} bias.
          expect_shape(m, m_addr, H, cols, index, lin, "matrix");
          expect_shape(b, b_addr, H, 1, index, lin, "bias");
          add_piece({lin < 4 ? 0 : 1, index, gate * H * cols, offset(m_addr), H * cols});
          add_piece({lin < 4 ? 2 : 3, index, gate * H, offset(b_addr), H});
        }
      }
    } catch (...) {
      cudnnDestroyTensorDescriptor(m);
      cudnnDestroyTensorDescriptor(b);
      throw;
    }
    cudnnDestroyTensorDescriptor(m);
    cudnnDestroyTensorDescriptor(b);
  }

  int64_t offset(const void* addr) const {
    const auto bytes = static_cast<const char*>(addr) - reinterpret_cast<const char*>(weights_);
    if (bytes < 0 || bytes % sizeof(float) != 0 || static_cast<size_t>(bytes) >= weight_bytes_)
      throw std::logic_error("cuDNN LSTM: cudnnGetRNNWeightParams returned an address outside the weight space");
    return bytes / static_cast<int64_t>(sizeof(float));
  }

  // A gate block joins the previous piece when both sides continue where that piece ended.
  void add_piece(const Piece& p) {
    for (Piece& q : pieces_)
      if (q.tensor == p.tensor && q.index == p.index && q.param_offset + q.count == p.param_offset &&
          q.space_offset + q.count == p.space_offset) {
        q.count += p.count;
        return;
      }
    pieces_.push_back(p);
  }

  // The block must be `rows` x `cols` floats, row-major and packed (cuDNN reports {1, rows, cols};
  // dimensions of 1 are skipped, so a bias {1, rows, 1} is a packed vector).
  static void expect_shape(cudnnTensorDescriptor_t desc, const void* addr, int64_t rows, int64_t cols, int64_t index,
                           int lin, const char* what) {
    cudnnDataType_t type{};
    int rank = 0, dims[8] = {}, strides[8] = {};
    check(cudnnGetTensorNdDescriptor(desc, 8, &type, &rank, dims, strides), "cudnnGetTensorNdDescriptor");
    std::vector<int64_t> got_dims, got_strides, want_dims, want_strides;
    for (int i = 0; i < rank && i < 8; ++i)
      if (dims[i] != 1) got_dims.push_back(dims[i]), got_strides.push_back(strides[i]);
    if (rows != 1) want_dims.push_back(rows), want_strides.push_back(cols);
    if (cols != 1) want_dims.push_back(cols), want_strides.push_back(1);
    if (addr && type == CUDNN_DATA_FLOAT && got_dims == want_dims && got_strides == want_strides) return;
    std::string got;
    for (int i = 0; i < rank && i < 8; ++i) got += " " + std::to_string(dims[i]) + "/" + std::to_string(strides[i]);
    throw std::logic_error("cuDNN LSTM: pseudo-layer " + std::to_string(index) + ", linLayerID " + std::to_string(lin) +
                           ": the " + what + " is not " + std::to_string(rows) + " x " + std::to_string(cols) +
                           " row-major floats (dims/strides:" + got + (addr ? ")" : "; no address)"));
  }

  LstmGeometry g_;
  CudnnContext& ctx_;
  cudnnDropoutDescriptor_t dropout_ = nullptr;
  cudnnRNNDescriptor_t rnn_ = nullptr;
  cudnnRNNDataDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnTensorDescriptor_t state_ = nullptr;
  size_t weight_bytes_ = 0, reserve_bytes_ = 0;
  float* weights_ = nullptr;    // cuDNN's weight space: the last forward's parameters
  float* dweights_ = nullptr;   // its gradient
  void* reserve_ = nullptr;     // from a training forward to its backward
  int32_t* dev_lengths_ = nullptr;
  int64_t dev_lengths_capacity_ = 0;
  int64_t steps_ = -1;              // T in x_ and y_
  std::vector<int32_t> described_;  // the lengths in x_, y_, state_ (N) and dev_lengths_
  std::vector<Piece> pieces_;
  float padding_fill_ = 0.f;
  bool trained_ = false;
};

}  // namespace

std::unique_ptr<LstmOp> make_cudnn_lstm(const LstmGeometry& g, CudnnContext& context) {
  return std::make_unique<CudnnLstm>(g, context);
}

}  // namespace trainer::models::cuda
