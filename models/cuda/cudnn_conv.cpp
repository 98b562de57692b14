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
// Algorithms are chosen once per op (one op per layer and shape): an FP32 one whose workspace fits
// kMaxWorkspace (and, in bf16, a dot-product one).
// - With runtime.deterministic (BackendSettings::deterministic): cuDNN's heuristics
//   (cudnnGetConvolution*Algorithm_v7, which time nothing), the first deterministic algorithm in
//   their order (choose() says which count as deterministic). The choice depends only on the descriptors, the GPU and
//   the cuDNN version, so two processes (a repeat, a resume, eager against graph) choose the same
//   and compute the same bits, as the CPU backend's runs do. Timing (cudnnFind*) would not: two
//   candidates that time alike come out in either order, and each process would take its own.
//   (PyTorch, aten/src/ATen/native/cudnn/Conv_v7.cpp: with cudnn.benchmark off it takes the _v7
//   heuristics' order, and with cudnn.deterministic also on, fixed default algorithms; its
//   getValidAlgorithms skips CUDNN_NON_DETERMINISTIC results under determinism, as choose() here.)
// - Without it: the fastest that cudnnFind* timed on the GPU, whatever its determinism (backward
//   filter's fast kernels sum with atomics; on the H200 ResNet-20's weight gradients took 11.7 ms a
//   step on the deterministic choice against PyTorch's 0.49 ms on cuDNN's fastest). A search is
//   remembered per length class (length_class.h): a speech batch, padded to its own longest
//   utterance, reuses the algorithms searched for an earlier extent of its class when cuDNN's
//   heuristics list them as supported for its geometry and their workspace fits, so a run searches
//   a bounded number of times instead of nearly every step.
//
// runtime.precision = bf16 (BackendSettings): the descriptors are bf16 with fp32 compute (cuDNN's
// BFLOAT16 configuration, tensor cores), so the op keeps bf16 copies: the input's (made in forward
// and read again by backward_weights), the weights' (made in forward, read by backward_data), the
// output gradient's (made by backward_weights, read by backward_data on the same dy), and bf16
// buffers for what cuDNN writes (the output, the input and weight gradients), widened into the
// fp32 tensors. The bias is added to, and its gradient summed from, the fp32 tensors.
#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cuda/cuda_backend.h"
#include "models/cuda/cuda_check.h"
#include "models/cuda/cudnn_ops.h"
#include "models/cuda/kernels.h"
#include "models/cuda/length_class.h"

namespace trainer::models::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

bool fp32_math(cudnnMathType_t m) { return m == CUDNN_DEFAULT_MATH || m == CUDNN_FMA_MATH; }

// The algorithms that compute through a transform (FFT, Winograd) rather than as dot products: their
// rounding is not a dot product's, so bf16 (whose error bound is stated for dot products,
// dnnl_precision.h) takes only the GEMM-like ones.
bool transform_based(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The algorithms cuDNN's API reference calls non-deterministic (they sum with atomics):
// cudnnConvolutionBwdDataAlgo_t's ALGO_0, cudnnConvolutionBwdFilterAlgo_t's ALGO_0 and ALGO_3. A
// result's `determinism` should say so too; this guards against a result that leaves it unset.
bool sums_with_atomics(cudnnConvolutionFwdAlgo_t) { return false; }
bool sums_with_atomics(cudnnConvolutionBwdDataAlgo_t a) { return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0; }
bool sums_with_atomics(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The first acceptable entry of a cudnnFind* result (sorted by measured time) or a
// cudnnGet*_v7 one (sorted by the heuristics' expected time), or null. In fp32 only the algorithms
// that keep FP32 math; in bf16 any math type (tensor-core math is what bf16 is for) but only
// dot-product algorithms. `fits(algo)`: cuDNN gives a workspace size for it under this op's
// descriptors and it is at most kMaxWorkspace (asked again rather than trusting the result's
// `memory`, which the heuristics only estimate). Under runtime.deterministic, in order of
// preference: one the result calls deterministic; one it does not call so but that is not among
// the documented atomic ones; else any (the run then may differ in the last bits, as before).
template <class Perf, class Fits>
const Perf* choose(const Perf* results, int count, bool bf16, bool deterministic, const Fits& fits) {
  const int levels = deterministic ? 3 : 1;
  for (int level = 3 - levels; level < 3; ++level)
    for (int i = 0; i < count; ++i) {
      const Perf& p = results[i];
      const bool math_ok = bf16 ? !transform_based(p.algo) : fp32_math(p.mathType);
      if (p.status != CUDNN_STATUS_SUCCESS || !math_ok) continue;
      if (level == 0 && (p.determinism != CUDNN_DETERMINISTIC || sums_with_atomics(p.algo))) continue;
      if (level == 1 && sums_with_atomics(p.algo)) continue;
      if (!fits(p.algo)) continue;
      return &p;
    }
  return nullptr;
}

[[noreturn]] void no_algorithm(const char* direction, const ConvGeometry& g, bool bf16) {
  throw std::runtime_error(std::string("cuDNN: no ") + (bf16 ? "bf16 " : "FP32 ") + direction +
                           " convolution algorithm for input " + std::to_string(g.batch) + "x" +
                           std::to_string(g.in_channels) + "x" + std::to_string(g.in_h) + "x" +
                           std::to_string(g.in_w) + ", " + std::to_string(g.out_channels) + " filters " +
                           std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w));
}

// Whether `algo` is listed with CUDNN_STATUS_SUCCESS among a heuristics result (an algorithm may be
// listed once per math type).
template <class Perf, class Algo>
bool listed(const std::vector<Perf>& results, int count, Algo algo) {
  for (int i = 0; i < count; ++i)
    if (results[i].algo == algo && results[i].status == CUDNN_STATUS_SUCCESS) return true;
  return false;
}

struct ConvAlgorithms {
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
};

// A geometry's length class (length_class.h) and the modes that change the candidates: the key of
// the searched choices. Ops are made on the training thread only.
using ClassKey = std::array<int64_t, 13>;
ClassKey class_key(const ConvGeometry& g, bool bf16, bool tf32) {
  return {g.batch,         g.in_channels, length_class(g.in_h), length_class(g.in_w), g.out_channels,
          g.kernel_h,      g.kernel_w,    g.stride_h,           g.stride_w,           g.pad_h,
          g.pad_w,         bf16 ? 1 : 0,  tf32 ? 1 : 0};
}
std::map<ClassKey, ConvAlgorithms>& searched_by_class() {
  static auto* searched = new std::map<ClassKey, ConvAlgorithms>;  // never destroyed, as the backend
  return *searched;
}
int64_t searches = 0;  // cudnnFind* searches (three calls each) in this process

}  // namespace

int64_t convolution_searches() { return searches; }

namespace {

class CudnnConv final : public ConvOp {
 public:
  Layout output_layout() const override { return Layout::kChannelsLast; }

  CudnnConv(const ConvGeometry& g, CudnnContext& context) : g_(g), ctx_(context) {
    if (g.src_layout != Layout::kChannelsLast || g.dst_layout != Layout::kChannelsLast)
      throw std::invalid_argument("CUDA convolution: only channels-last activations (the CUDA backend's layout)");
    if (g.src_dtype != DType::kF32 || g.dst_dtype != DType::kF32)
      throw std::invalid_argument("CUDA convolution: fp32 activations only (the CUDA backend keeps no bf16 ones)");
    const int n = static_cast<int>(g.batch), c = static_cast<int>(g.in_channels), k = static_cast<int>(g.out_channels);
    check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&bias_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y32_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateFilterDescriptor(&w_), "cudnnCreateFilterDescriptor");
    check(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
    const cudnnDataType_t data = bf16_ ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    check(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, data, n, c, static_cast<int>(g.in_h),
                                     static_cast<int>(g.in_w)),
          "conv input descriptor");
    check(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, data, n, k, static_cast<int>(g.out_h()),
                                     static_cast<int>(g.out_w())),
          "conv output descriptor");
    check(cudnnSetTensor4dDescriptor(y32_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, n, k, static_cast<int>(g.out_h()),
                                     static_cast<int>(g.out_w())),
          "conv fp32 output descriptor");
    check(cudnnSetTensor4dDescriptor(bias_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1), "conv bias descriptor");
    check(cudnnSetFilter4dDescriptor(w_, data, CUDNN_TENSOR_NHWC, k, c, static_cast<int>(g.kernel_h),
                                     static_cast<int>(g.kernel_w)),
          "conv filter descriptor");
    check(cudnnSetConvolution2dDescriptor(conv_, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w),
                                          static_cast<int>(g.stride_h), static_cast<int>(g.stride_w), 1, 1,
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "conv descriptor");
    // FMA math never uses tensor cores for FP32 data; DEFAULT math lets cuDNN use TF32 ones (and
    // the algorithms cudnnFind* then returns include them): runtime.precision = "tf32". bf16 data
    // runs on tensor cores under tensor-op math.
    check(cudnnSetConvolutionMathType(conv_, bf16_            ? CUDNN_TENSOR_OP_MATH
                                             : ctx_.tf32()    ? CUDNN_DEFAULT_MATH
                                                              : CUDNN_FMA_MATH),
          "cudnnSetConvolutionMathType");
    int on = 0, oc = 0, oh = 0, ow = 0;
    check(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &on, &oc, &oh, &ow), "conv output size");
    if (on != n || oc != k || oh != g.out_h() || ow != g.out_w())
      throw std::logic_error("cuDNN convolution: output size differs from ConvGeometry's");

    const ConvAlgorithms a = choose_algorithms();
    fwd_algo_ = a.fwd;
    bwd_data_algo_ = a.bwd_data;
    bwd_filter_algo_ = a.bwd_filter;
    cudnnHandle_t h = ctx_.handle();
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
    if (bf16_) {
      auto half = [this](int64_t count) {
        return static_cast<uint16_t*>(ctx_.memory().allocate(sizeof(uint16_t) * static_cast<size_t>(count)));
      };
      x16_ = half(inputs());
      dx16_ = half(inputs());
      out16_ = half(outputs());
      w16_ = half(weights());
      dw16_ = half(weights());
    }
  }

  ~CudnnConv() override {
    for (void* p : {static_cast<void*>(w_nhwc_), static_cast<void*>(dw_nhwc_), static_cast<void*>(x16_),
                    static_cast<void*>(dx16_), static_cast<void*>(out16_), static_cast<void*>(w16_),
                    static_cast<void*>(dw16_)})
      if (p) ctx_.memory().free(p);
    cudnnDestroyConvolutionDescriptor(conv_);
    cudnnDestroyFilterDescriptor(w_);
    cudnnDestroyTensorDescriptor(bias_);
    cudnnDestroyTensorDescriptor(y32_);
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
    if (bf16_) {
      check(launch_to_bf16(weights(), w, w16_, ctx_.stream()), "conv weights to bf16");
      check(launch_to_bf16(inputs(), x, x16_, ctx_.stream()), "conv input to bf16");
      x16_of_ = x;
      dy16_of_ = nullptr;
      check(cudnnConvolutionForward(ctx_.handle(), &one, x_, x16_, w_, w16_, conv_, fwd_algo_, ctx_.workspace(),
                                    ctx_.workspace_bytes(), &zero, y_, out16_),
            "cudnnConvolutionForward (bf16)");
      check(launch_from_bf16(outputs(), out16_, y, ctx_.stream()), "conv output from bf16");
    } else {
      check(cudnnConvolutionForward(ctx_.handle(), &one, x_, x, w_, w, conv_, fwd_algo_, ctx_.workspace(),
                                    ctx_.workspace_bytes(), &zero, y_, y),
            "cudnnConvolutionForward");
    }
    if (g_.bias && b) check(cudnnAddTensor(ctx_.handle(), &one, bias_, b, &one, y32_, y), "cudnnAddTensor (conv bias)");
  }

  void backward_data(const float* dy, const float* w, float* dx) override {
    const float one = 1.f, zero = 0.f;
    if (reorder_) w = w_nhwc_;  // forward's reordered copy of the same weights
    if (!bf16_) {
      check(cudnnConvolutionBackwardData(ctx_.handle(), &one, w_, w, y_, dy, conv_, bwd_data_algo_, ctx_.workspace(),
                                         ctx_.workspace_bytes(), &zero, x_, dx),
            "cudnnConvolutionBackwardData");
      return;
    }
    // backward_weights right before, on the same dy, made its bf16 copy; w16_ is forward's copy.
    if (dy != dy16_of_) check(launch_to_bf16(outputs(), dy, out16_, ctx_.stream()), "conv output gradient to bf16");
    dy16_of_ = nullptr;  // once: a second call may bring other values in the same buffer
    check(cudnnConvolutionBackwardData(ctx_.handle(), &one, w_, w16_, y_, out16_, conv_, bwd_data_algo_,
                                       ctx_.workspace(), ctx_.workspace_bytes(), &zero, x_, dx16_),
          "cudnnConvolutionBackwardData (bf16)");
    check(launch_from_bf16(inputs(), dx16_, dx, ctx_.stream()), "conv input gradient from bf16");
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const float one = 1.f, zero = 0.f;
    float* dw_out = reorder_ ? dw_nhwc_ : dw;
    if (bf16_) {
      if (x != x16_of_) check(launch_to_bf16(inputs(), x, x16_, ctx_.stream()), "conv input to bf16");
      check(launch_to_bf16(outputs(), dy, out16_, ctx_.stream()), "conv output gradient to bf16");
      dy16_of_ = dy;
      check(cudnnConvolutionBackwardFilter(ctx_.handle(), &one, x_, x16_, y_, out16_, conv_, bwd_filter_algo_,
                                           ctx_.workspace(), ctx_.workspace_bytes(), &zero, w_, dw16_),
            "cudnnConvolutionBackwardFilter (bf16)");
      check(launch_from_bf16(weights(), dw16_, dw_out, ctx_.stream()), "conv weight gradient from bf16");
    } else {
      check(cudnnConvolutionBackwardFilter(ctx_.handle(), &one, x_, x, y_, dy, conv_, bwd_filter_algo_,
                                           ctx_.workspace(), ctx_.workspace_bytes(), &zero, w_, dw_out),
            "cudnnConvolutionBackwardFilter");
    }
    if (reorder_)
      check(launch_filter_from_channels_last(dw_nhwc_, g_.out_channels, g_.in_channels, g_.kernel_h, g_.kernel_w, dw,
                                             ctx_.stream()),
            "filter gradient from channels-last");
    if (g_.bias && db)
      check(cudnnConvolutionBackwardBias(ctx_.handle(), &one, y32_, dy, &zero, bias_, db),
            "cudnnConvolutionBackwardBias");
  }

 private:
  // The workspace each algorithm needs under this op's descriptors; false where cuDNN gives none
  // (the algorithm does not support them) or it exceeds kMaxWorkspace.
  bool fits(cudnnConvolutionFwdAlgo_t a) const {
    size_t bytes = 0;
    return cudnnGetConvolutionForwardWorkspaceSize(ctx_.handle(), x_, w_, conv_, y_, a, &bytes) ==
               CUDNN_STATUS_SUCCESS &&
           bytes <= kMaxWorkspace;
  }
  bool fits(cudnnConvolutionBwdDataAlgo_t a) const {
    size_t bytes = 0;
    return cudnnGetConvolutionBackwardDataWorkspaceSize(ctx_.handle(), w_, y_, conv_, x_, a, &bytes) ==
               CUDNN_STATUS_SUCCESS &&
           bytes <= kMaxWorkspace;
  }
  bool fits(cudnnConvolutionBwdFilterAlgo_t a) const {
    size_t bytes = 0;
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx_.handle(), x_, y_, conv_, w_, a, &bytes) ==
               CUDNN_STATUS_SUCCESS &&
           bytes <= kMaxWorkspace;
  }

  // cuDNN's heuristics for the three directions (every algorithm, in their order of expected time;
  // they run nothing on the GPU).
  struct Heuristics {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd =
        std::vector<cudnnConvolutionFwdAlgoPerf_t>(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data =
        std::vector<cudnnConvolutionBwdDataAlgoPerf_t>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter =
        std::vector<cudnnConvolutionBwdFilterAlgoPerf_t>(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    int fwd_count = 0, bwd_data_count = 0, bwd_filter_count = 0;
  };
  Heuristics heuristics() const {
    Heuristics r;
    cudnnHandle_t h = ctx_.handle();
    check(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, static_cast<int>(r.fwd.size()), &r.fwd_count,
                                                 r.fwd.data()),
          "cudnnGetConvolutionForwardAlgorithm_v7");
    check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, static_cast<int>(r.bwd_data.size()),
                                                      &r.bwd_data_count, r.bwd_data.data()),
          "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, static_cast<int>(r.bwd_filter.size()),
                                                        &r.bwd_filter_count, r.bwd_filter.data()),
          "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    return r;
  }

  // See the header: timing-free under runtime.deterministic, else searched once per length class.
  ConvAlgorithms choose_algorithms() {
    auto fits_here = [this](auto algo) { return fits(algo); };
    const bool deterministic = ctx_.settings().deterministic;
    if (deterministic) {
      const Heuristics r = heuristics();
      const auto* f = choose(r.fwd.data(), r.fwd_count, bf16_, deterministic, fits_here);
      if (!f) no_algorithm("forward", g_, bf16_);
      const auto* d = choose(r.bwd_data.data(), r.bwd_data_count, bf16_, deterministic, fits_here);
      if (!d) no_algorithm("backward-data", g_, bf16_);
      const auto* b = choose(r.bwd_filter.data(), r.bwd_filter_count, bf16_, deterministic, fits_here);
      if (!b) no_algorithm("backward-filter", g_, bf16_);
      return {f->algo, d->algo, b->algo};
    }
    const ClassKey key = class_key(g_, bf16_, ctx_.tf32());
    auto& searched = searched_by_class();
    if (const auto it = searched.find(key); it != searched.end()) {
      // Searched for another extent of this class: reuse it where cuDNN supports it here (the
      // heuristics list it with a success status) and its workspace fits.
      const ConvAlgorithms& a = it->second;
      const Heuristics r = heuristics();
      if (listed(r.fwd, r.fwd_count, a.fwd) && fits(a.fwd) && listed(r.bwd_data, r.bwd_data_count, a.bwd_data) &&
          fits(a.bwd_data) && listed(r.bwd_filter, r.bwd_filter_count, a.bwd_filter) && fits(a.bwd_filter))
        return a;
    }
    const ConvAlgorithms a = search(fits_here);
    searched.insert_or_assign(key, a);
    return a;
  }

  // cudnnFind*: times the candidates on the GPU (allocating its own workspaces).
  template <class Fits>
  ConvAlgorithms search(const Fits& fits_here) {
    ++searches;
    const bool deterministic = ctx_.settings().deterministic;  // false: choose_algorithms searches only then
    cudnnHandle_t h = ctx_.handle();
    int returned = 0;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    check(cudnnFindConvolutionForwardAlgorithm(h, x_, w_, conv_, y_, static_cast<int>(fwd.size()), &returned,
                                               fwd.data()),
          "cudnnFindConvolutionForwardAlgorithm");
    const auto* f = choose(fwd.data(), returned, bf16_, deterministic, fits_here);
    if (!f) no_algorithm("forward", g_, bf16_);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    check(cudnnFindConvolutionBackwardDataAlgorithm(h, w_, y_, conv_, x_, static_cast<int>(bwd_data.size()),
                                                    &returned, bwd_data.data()),
          "cudnnFindConvolutionBackwardDataAlgorithm");
    const auto* d = choose(bwd_data.data(), returned, bf16_, deterministic, fits_here);
    if (!d) no_algorithm("backward-data", g_, bf16_);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    check(cudnnFindConvolutionBackwardFilterAlgorithm(h, x_, y_, conv_, w_, static_cast<int>(bwd_filter.size()),
                                                      &returned, bwd_filter.data()),
          "cudnnFindConvolutionBackwardFilterAlgorithm");
    const auto* b = choose(bwd_filter.data(), returned, bf16_, deterministic, fits_here);
    if (!b) no_algorithm("backward-filter", g_, bf16_);
    return {f->algo, d->algo, b->algo};
  }

  int64_t weights() const { return g_.out_channels * g_.in_channels * g_.kernel_h * g_.kernel_w; }
  int64_t inputs() const { return g_.batch * g_.in_channels * g_.in_h * g_.in_w; }
  int64_t outputs() const { return g_.batch * g_.out_channels * g_.out_h() * g_.out_w(); }

  ConvGeometry g_;
  CudnnContext& ctx_;
  const bool bf16_ = ctx_.bf16();  // declared before the constructor body reads it
  const bool reorder_ = g_.kernel_h * g_.kernel_w > 1 && g_.in_channels > 1;
  float* w_nhwc_ = nullptr;   // the last forward's weights, {O, KH, KW, I}
  float* dw_nhwc_ = nullptr;  // backward_weights' result before its reorder
  // runtime.precision = bf16: the copies (see the header).
  uint16_t *x16_ = nullptr, *dx16_ = nullptr, *out16_ = nullptr, *w16_ = nullptr, *dw16_ = nullptr;
  const float* x16_of_ = nullptr;   // the input whose copy x16_ holds
  const float* dy16_of_ = nullptr;  // the output gradient whose copy out16_ holds
  // x_, y_, w_ in the data type the kernels read (bf16 or fp32); y32_ the fp32 output tensor.
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr, y32_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo_{};
};

}  // namespace

CudnnContext::CudnnContext(DeviceMemory& memory, cudaStream_t stream, const BackendSettings& settings)
    : memory_(memory), stream_(stream), settings_(settings) {
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
