// The device seam. Layers never call oneDNN, cuDNN or BLAS directly: they ask a Backend for ops.
//
// Ops with per-shape setup (convolution, batch norm, pooling) are objects made once per layer and
// shape: they cache the library's primitives, reordered weights and workspaces, so a training step
// allocates nothing. Stateless ops (GEMM, element-wise loops, the loss) are plain methods.
// All pointers are device pointers of this backend (host memory for the CPU backend); layouts follow
// models/tensor.h. The backend chooses the layout of every activation a convolution produces
// (activation_layout); the other ops keep the layout they are given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/tensor.h"

namespace trainer::models {

struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool bias = false;
  Layout src_layout = Layout::kChannelsLast, dst_layout = Layout::kChannelsLast;
  int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  bool operator==(const ConvGeometry& o) const;
};

class ConvOp {
 public:
  virtual ~ConvOp() = default;
  // y = conv(x, w) + b. b may be null when the geometry has no bias.
  virtual void forward(const float* x, const float* w, const float* b, float* y) = 0;
  // dx = conv_transpose(dy, w). w must be the weights of the preceding forward.
  virtual void backward_data(const float* dy, const float* w, float* dx) = 0;
  // dw (and db when the geometry has a bias) from the forward input and dy. Overwrites dw/db.
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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The layout convolutions write for an output of `channels` channels.
  virtual Layout activation_layout(int64_t channels) const = 0;

  virtual std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) = 0;
  virtual std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) = 0;
  virtual std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) = 0;

  // C = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X^T when trans_X.
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) = 0;
  // y[i, :] = bias (broadcast over `rows` rows of `cols`): used before a GEMM accumulates into y.
  virtual void broadcast_rows(int64_t rows, int64_t cols, const float* bias, float* y) = 0;
  // db[j] = sum_i dy[i, j].
  virtual void sum_rows(int64_t rows, int64_t cols, const float* dy, float* db) = 0;

  virtual void relu_forward(int64_t n, const float* x, float* y) = 0;
  // dx = dy where y > 0, else 0 (y: the ReLU output).
  virtual void relu_backward(int64_t n, const float* y, const float* dy, float* dx) = 0;
  virtual void add(int64_t n, const float* a, const float* b, float* y) = 0;
  virtual void copy(int64_t n, const float* x, float* y) = 0;

  // Option-A shortcut of CIFAR ResNets: spatial subsampling by `stride`, then `pad` zero channels
  // on each side (x.dim(1) + 2*pad out, in layout y.layout). Backward keeps the gradient of the
  // data channels. The tensors carry shapes and layouts; y/dx must be sized by the caller.
  virtual void shortcut_a_forward(const Tensor& x, int64_t stride, int64_t pad, Tensor& y) = 0;
  virtual void shortcut_a_backward(const Tensor& dy, int64_t stride, int64_t pad, Tensor& dx) = 0;

  // PyTorch's NCHW order (what its flatten and its tensors see) <-> a tensor in any layout.
  virtual void to_nchw(const Tensor& x, float* y) = 0;
  virtual void from_nchw(const float* x, Tensor& y) = 0;

  // Mean softmax cross-entropy over the batch with label smoothing `smoothing` (PyTorch's
  // definition: target = (1 - s) * one_hot + s / classes). Writes dlogits (gradient of the mean
  // loss) when non-null, and the number of correct argmax predictions to *correct when non-null.
  virtual double softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits,
                                       const int32_t* labels, float smoothing, float* dlogits,
                                       int64_t* correct) = 0;
};

// The CPU backend (oneDNN primitives, OpenBLAS, OpenMP loops). One per process.
Backend& cpu_backend();

}  // namespace trainer::models
