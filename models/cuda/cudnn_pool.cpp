// Pooling on cuDNN: max, and average excluding padding (PoolKind), channels-last. cuDNN's backward
// needs the forward's input and output, which the op keeps from the last training forward (the
// layer keeps both alive until its backward, as the interface's "gradient of the last training
// forward" implies).
#include <stdexcept>

#include "models/cuda/cuda_check.h"
#include "models/cuda/cudnn_ops.h"

namespace trainer::models::cuda {
namespace {

class CudnnPool final : public PoolOp {
 public:
  CudnnPool(const PoolGeometry& g, CudnnContext& context) : g_(g), ctx_(context) {
    if (g.layout != Layout::kChannelsLast)
      throw std::invalid_argument("CUDA pooling: only channels-last activations (the CUDA backend's layout)");
    if (g.dtype != DType::kF32) throw std::invalid_argument("CUDA pooling: fp32 activations only");
    const int n = static_cast<int>(g.batch), c = static_cast<int>(g.channels);
    check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
    check(cudnnCreatePoolingDescriptor(&pool_), "cudnnCreatePoolingDescriptor");
    check(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, static_cast<int>(g.in_h),
                                     static_cast<int>(g.in_w)),
          "pool input descriptor");
    check(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, static_cast<int>(g.out_h()),
                                     static_cast<int>(g.out_w())),
          "pool output descriptor");
    const cudnnPoolingMode_t mode =
        g.kind == PoolKind::kMax ? CUDNN_POOLING_MAX : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    check(cudnnSetPooling2dDescriptor(pool_, mode, CUDNN_NOT_PROPAGATE_NAN, static_cast<int>(g.kernel_h),
                                      static_cast<int>(g.kernel_w), static_cast<int>(g.pad_h),
                                      static_cast<int>(g.pad_w), static_cast<int>(g.stride_h),
                                      static_cast<int>(g.stride_w)),
          "pooling descriptor");
    int on = 0, oc = 0, oh = 0, ow = 0;
    check(cudnnGetPooling2dForwardOutputDim(pool_, x_, &on, &oc, &oh, &ow), "pool output size");
    if (on != n || oc != c || oh != g.out_h() || ow != g.out_w())
      throw std::logic_error("cuDNN pooling: output size differs from PoolGeometry's");
  }

  ~CudnnPool() override {
    cudnnDestroyPoolingDescriptor(pool_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyTensorDescriptor(x_);
  }

  void forward(const float* x, float* y, bool training) override {
    const float one = 1.f, zero = 0.f;
    check(cudnnPoolingForward(ctx_.handle(), pool_, &one, x_, x, &zero, y_, y), "cudnnPoolingForward");
    if (training) {
      last_x_ = x;
      last_y_ = y;
    }
  }

  void backward(const float* dy, float* dx) override {
    if (!last_x_) throw std::logic_error("CUDA pooling: backward before a training forward");
    const float one = 1.f, zero = 0.f;
    check(cudnnPoolingBackward(ctx_.handle(), pool_, &one, y_, last_y_, y_, dy, x_, last_x_, &zero, x_, dx),
          "cudnnPoolingBackward");
  }

 private:
  PoolGeometry g_;
  CudnnContext& ctx_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnPoolingDescriptor_t pool_ = nullptr;
  const float* last_x_ = nullptr;
  const float* last_y_ = nullptr;
};

}  // namespace

std::unique_ptr<PoolOp> make_cudnn_pool(const PoolGeometry& g, CudnnContext& context) {
  return std::make_unique<CudnnPool>(g, context);
}

}  // namespace trainer::models::cuda
