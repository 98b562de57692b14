// Convolution on cuDNN 9's legacy convolution API (forward, backward data, backward filter).
//
// Tensors are channels-last (NHWC), the CUDA backend's activation layout. Parameters hold weights in
// PyTorch's {O, I, KH, KW}, so checkpoints and the optimizer see the same values as on the CPU;
// cuDNN gets them channels-last too ({O, KH, KW, I}, its NHWC filter format: the all-NHWC case is
// the one its channels-last kernels are written for, and what PyTorch's channels_last passes), so
// the op keeps a reordered copy made in forward and reused by backward_data (the interface promises
// the same weights), and backward_weights reorders the gradient back. A 1x1 kernel needs neither
// reorder: the two orders are the same. FP32 math: the convolution descriptor asks for FMA math, which keeps
// cuDNN off TF32 tensor cores (CUDNN_DEFAULT_MATH would allow TF32 on Ampere and later).
//
// Algorithms are chosen once per op (one op per layer and shape) by cudnnFind*, which times the
// candidates on the GPU: the fastest FP32 one whose workspace fits kMaxWorkspace. With
// runtime.deterministic (set_deterministic_algorithms) the fastest deterministic one first, else the
// fastest that works: a run then repeats on the same GPU, as the CPU backend's runs do. Without it
// the fastest whatever its determinism: backward filter's fast kernels sum with atomics (on the H200,
// ResNet-20's weight gradients took 11.7 ms a step on the deterministic choice against PyTorch's
// 0.49 ms on cuDNN's fastest).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cuda/cuda_backend.h"
#include "models/cuda/cuda_check.h"
#include "models/cuda/cudnn_ops.h"
#include "models/cuda/kernels.h"

namespace trainer::models::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

bool deterministic_algorithms = false;  // runtime.deterministic, read when an op is made

bool fp32_math(cudnnMathType_t m) { return m == CUDNN_DEFAULT_MATH || m == CUDNN_FMA_MATH; }

// The fastest acceptable result of a cudnnFind* call (its results come sorted by time).
template <class Perf>
Perf choose(const Perf* results, int count, const char* direction, const ConvGeometry& g) {
  for (bool need_deterministic : {deterministic_algorithms, false})
    for (int i = 0; i < count; ++i) {
      const Perf& p = results[i];
      if (p.status != CUDNN_STATUS_SUCCESS || !fp32_math(p.mathType) || p.memory > kMaxWorkspace) continue;
      if (need_deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
      return p;
    }
  throw std::runtime_error(std::string("cuDNN: no FP32 ") + direction + " convolution algorithm for input " +
                           std::to_string(g.batch) + "x" + std::to_string(g.in_channels) + "x" +
                           std::to_string(g.in_h) + "x" + std::to_string(g.in_w) + ", " +
                           std::to_string(g.out_channels) + " filters " + std::to_string(g.kernel_h) + "x" +
                           std::to_string(g.kernel_w));
}

}  // namespace

void set_deterministic_algorithms(bool deterministic) { deterministic_algorithms = deterministic; }

namespace {

class CudnnConv final : public ConvOp {
 public:
  Layout output_layout() const override { return Layout::kChannelsLast; }

  CudnnConv(const ConvGeometry& g, CudnnContext& context) : g_(g), ctx_(context) {
    if (g.src_layout != Layout::kChannelsLast || g.dst_layout != Layout::kChannelsLast)
      throw std::invalid_argument("CUDA convolution: only channels-last activations (the CUDA backend's layout)");
    const int n = static_cast<int>(g.batch), c = static_cast<int>(g.in_channels), k = static_cast<int>(g.out_channels);
    check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&bias_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateFilterDescriptor(&w_), "cudnnCreateFilterDescriptor");
    check(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
    check(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, c, static_cast<int>(g.in_h),
                                     static_cast<int>(g.in_w)),
          "conv input descriptor");
    check(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, k, static_cast<int>(g.out_h()),
                                     static_cast<int>(g.out_w())),
          "conv output descriptor");
    check(cudnnSetTensor4dDescriptor(bias_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1), "conv bias descriptor");
    check(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, k, c, static_cast<int>(g.kernel_h),
                                     static_cast<int>(g.kernel_w)),
          "conv filter descriptor");
    check(cudnnSetConvolution2dDescriptor(conv_, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w),
                                          static_cast<int>(g.stride_h), static_cast<int>(g.stride_w), 1, 1,
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "conv descriptor");
    // FMA math never uses tensor cores for FP32 data; DEFAULT math lets cuDNN use TF32 ones (and
    // the algorithms cudnnFind* then returns include them): runtime.precision = "tf32".
    check(cudnnSetConvolutionMathType(conv_, tf32_allowed() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
          "cudnnSetConvolutionMathType");
    int on = 0, oc = 0, oh = 0, ow = 0;
    check(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &on, &oc, &oh, &ow), "conv output size");
    if (on != n || oc != k || oh != g.out_h() || ow != g.out_w())
      throw std::logic_error("cuDNN convolution: output size differs from ConvGeometry's");

    cudnnHandle_t h = ctx_.handle();
    int returned = 0;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    check(cudnnFindConvolutionForwardAlgorithm(h, x_, w_, conv_, y_, static_cast<int>(fwd.size()), &returned,
                                               fwd.data()),
          "cudnnFindConvolutionForwardAlgorithm");
    const auto f = choose(fwd.data(), returned, "forward", g);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    check(cudnnFindConvolutionBackwardDataAlgorithm(h, w_, y_, conv_, x_, static_cast<int>(bwd_data.size()),
                                                    &returned, bwd_data.data()),
          "cudnnFindConvolutionBackwardDataAlgorithm");
    const auto d = choose(bwd_data.data(), returned, "backward-data", g);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    check(cudnnFindConvolutionBackwardFilterAlgorithm(h, x_, y_, conv_, w_, static_cast<int>(bwd_filter.size()),
                                                      &returned, bwd_filter.data()),
          "cudnnFindConvolutionBackwardFilterAlgorithm");
    const auto b = choose(bwd_filter.data(), returned, "backward-filter", g);
    fwd_algo_ = f.algo;
    bwd_data_algo_ = d.algo;
    bwd_filter_algo_ = b.algo;
    // Ask again for the chosen algorithms' workspace under this descriptor (Find's figure may differ).
    size_t fb = 0, db = 0, wb = 0;
    check(cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, fwd_algo_, &fb), "forward workspace size");
    check(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, bwd_data_algo_, &db),
          "backward-data workspace size");
    check(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, bwd_filter_algo_, &wb),
          "backward-filter workspace size");
    ctx_.reserve_workspace(std::max({fb, db, wb}));
    if (reorder_) {
      const size_t bytes = sizeof(float) * static_cast<size_t>(weights());
      w_nhwc_ = static_cast<float*>(ctx_.memory().allocate(bytes));
      dw_nhwc_ = static_cast<float*>(ctx_.memory().allocate(bytes));
    }
  }

  ~CudnnConv() override {
    if (w_nhwc_) ctx_.memory().free(w_nhwc_);
    if (dw_nhwc_) ctx_.memory().free(dw_nhwc_);
    cudnnDestroyConvolutionDescriptor(conv_);
    cudnnDestroyFilterDescriptor(w_);
    cudnnDestroyTensorDescriptor(bias_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyTensorDescriptor(x_);
  }

  void forward(const float* x, const float* w, const float* b, float* y) override {
    const float one = 1.f, zero = 0.f;
    if (reorder_) {
      check(launch_filter_to_channels_last(w, g_.out_channels, g_.in_channels, g_.kernel_h, g_.kernel_w, w_nhwc_,
                                           ctx_.stream()),
            "filter to channels-last");
      w = w_nhwc_;
    }
    check(cudnnConvolutionForward(ctx_.handle(), &one, x_, x, w_, w, conv_, fwd_algo_, ctx_.workspace(),
                                  ctx_.workspace_bytes(), &zero, y_, y),
          "cudnnConvolutionForward");
    if (g_.bias && b) check(cudnnAddTensor(ctx_.handle(), &one, bias_, b, &one, y_, y), "cudnnAddTensor (conv bias)");
  }

  void backward_data(const float* dy, const float* w, float* dx) override {
    const float one = 1.f, zero = 0.f;
    if (reorder_) w = w_nhwc_;  // forward's reordered copy of the same weights
    check(cudnnConvolutionBackwardData(ctx_.handle(), &one, w_, w, y_, dy, conv_, bwd_data_algo_, ctx_.workspace(),
                                       ctx_.workspace_bytes(), &zero, x_, dx),
          "cudnnConvolutionBackwardData");
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const float one = 1.f, zero = 0.f;
    check(cudnnConvolutionBackwardFilter(ctx_.handle(), &one, x_, x, y_, dy, conv_, bwd_filter_algo_,
                                         ctx_.workspace(), ctx_.workspace_bytes(), &zero, w_,
                                         reorder_ ? dw_nhwc_ : dw),
          "cudnnConvolutionBackwardFilter");
    if (reorder_)
      check(launch_filter_from_channels_last(dw_nhwc_, g_.out_channels, g_.in_channels, g_.kernel_h, g_.kernel_w, dw,
                                             ctx_.stream()),
            "filter gradient from channels-last");
    if (g_.bias && db)
      check(cudnnConvolutionBackwardBias(ctx_.handle(), &one, y_, dy, &zero, bias_, db), "cudnnConvolutionBackwardBias");
  }

 private:
  int64_t weights() const { return g_.out_channels * g_.in_channels * g_.kernel_h * g_.kernel_w; }

  ConvGeometry g_;
  CudnnContext& ctx_;
  const bool reorder_ = g_.kernel_h * g_.kernel_w > 1 && g_.in_channels > 1;
  float* w_nhwc_ = nullptr;   // the last forward's weights, {O, KH, KW, I}
  float* dw_nhwc_ = nullptr;  // backward_weights' result before its reorder
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
};

}  // namespace

CudnnContext::CudnnContext(DeviceMemory& memory, cudaStream_t stream) : memory_(memory), stream_(stream) {
  check(cudnnCreate(&handle_), "cudnnCreate");
  check(cudnnSetStream(handle_, stream_), "cudnnSetStream");
}

CudnnContext::~CudnnContext() {
  if (workspace_) memory_.free(workspace_);
  cudnnDestroy(handle_);
}

void CudnnContext::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return;
  // Freeing device memory waits for the device, so no enqueued op still uses the old workspace.
  if (workspace_) memory_.free(workspace_);
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  workspace_ = memory_.allocate(bytes);
  workspace_bytes_ = bytes;
}

std::unique_ptr<ConvOp> make_cudnn_conv(const ConvGeometry& g, CudnnContext& context) {
  return std::make_unique<CudnnConv>(g, context);
}

}  // namespace trainer::models::cuda
