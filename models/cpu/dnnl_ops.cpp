#include "models/cpu/dnnl_ops.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/cpu/dnnl_context.h"
#include "models/cpu/dnnl_staged.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/tensor.h"

namespace trainer::models::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

// Primitives are made with a user-managed scratchpad, and all of them share one process-wide
// buffer: ops run one at a time, and the library's own per-execution scratchpad allocations were
// page-faulting fresh memory every step (about a sixth of a ResNet-20 step).
dnnl::primitive_attr scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory scratchpad(const memory::desc& md) {
  static HostBuffer buffer;
  return memory(md, engine(), buffer.reserve(static_cast<int64_t>(md.get_size() / sizeof(float)) + 1));
}

// Records the implementation oneDNN picked for a primitive we made (dnnl_dispatch.h), to catch a
// shape or layout that falls off the JIT kernels onto a reference loop.
template <class PrimitiveDesc>
void report(const char* what, const PrimitiveDesc& pd, const memory::desc& src, Layout layout) {
  const auto d = src.get_dims();
  std::string shape = "src";
  for (size_t i = 0; i < d.size(); ++i) shape += (i ? "x" : " ") + std::to_string(d[i]);
  record_primitive(what, shape + " " + layout_name(layout), pd.impl_info_str());
}

// A primitive that needs no scratchpad is given none (oneDNN 3.x flags an argument its primitive
// does not take, and refuses one it counts among neither its inputs nor its outputs).
template <class PrimitiveDesc>
void execute(const dnnl::primitive& p, const PrimitiveDesc& pd, std::unordered_map<int, memory> args) {
  if (!pd.scratchpad_desc().is_zero()) args.insert({DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())});
  p.execute(stream(), args);
  stream().wait();
}

// oneDNN 2.6's AVX2 (and SSE4.1) 1x1 backward-weights kernel, given a strided channels-last source
// whose channels do not fill its 8-channel block, subsamples the source into a workspace it then
// overruns: wrong weight gradients, or a crash (oneDNN issue 6035; found by layers_test's strided
// 1x1 case at ONEDNN_MAX_CPU_ISA=AVX2). Such a combination is skipped like a reference kernel.
bool broken_1x1_backward_weights(const ConvGeometry& g,
                                 const dnnl::convolution_backward_weights::primitive_desc& pd) {
  const std::string impl = pd.impl_info_str();
  const bool strided = g.stride_h > 1 || g.stride_w > 1;
  const bool nhwc_src = pd.src_desc() == activation_md(g.batch, g.in_channels, g.in_h, g.in_w, Layout::kChannelsLast);
  return impl.rfind("jit_1x1:", 0) == 0 && impl.find("avx512") == std::string::npos && strided && nhwc_src &&
         g.in_channels % 8 != 0;
}

// The three primitive descriptors of one convolution and the layout its output is written in.
struct ConvPrimitiveDescs {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_w;
  Layout dst_layout;
};

// Chooses the algorithm and the layouts the primitives see (src: the input in g.src_layout).
//
// Winograd F(4,3) where it pays: measured on AVX-512 (BENCHMARKS.md) 1.5-2x faster than direct
// from 32 channels up and no faster at 16, so kAuto asks for it from 32 channels. oneDNN 2.6 had an
// f32 Winograd kernel for AVX-512 (nChw16c) only; 3.2 has none, so it is asked, refused and direct is
// taken (as everywhere the engine has no Winograd kernel).
//
// The layouts, in order of preference, until forward and both backward passes get non-reference
// kernels: the tensors' own; the input in whatever layout oneDNN prefers (a 3-channel
// channels-last image into a blocked output: the stem), reordered on the way in and its gradient
// on the way out; a channels-last output instead of the blocked one, and then channels-last on
// both sides (oneDNN's im2col + GEMM convolution, which takes any kernel size: the large speech
// kernels have no direct JIT kernel on AVX2); last, oneDNN's choice on both sides with the output
// reordered to channels-last (DeepSpeech's second convolution at batch 1 on AVX2). When none gets
// such kernels, the first that exists is taken (and record_primitive warns about it).
ConvPrimitiveDescs choose_conv_primitives(const ConvGeometry& g, const memory::desc& src_md,
                                          const memory::desc& bias_md, ConvAlgorithm algorithm) {
  const memory::dims strides{g.stride_h, g.stride_w};
  const memory::dims pad_l{g.pad_h, g.pad_w};
  // Right padding so the output size is exactly what the geometry says (floor division).
  const memory::dims pad_r{(g.out_h() - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_h,
                           (g.out_w() - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_w};
  const memory::desc any_w({g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, dt::f32, tag::any);
  const memory::desc bias = g.bias ? bias_md : memory::desc();

  const bool winograd_shape = g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
                              g.src_layout == Layout::kBlocked16 && g.dst_layout == Layout::kBlocked16;
  const bool wide = g.in_channels >= 32 && g.out_channels >= 32;
  std::vector<dnnl::algorithm> algorithms{dnnl::algorithm::convolution_direct};
  if (winograd_shape &&
      (algorithm == ConvAlgorithm::kWinograd || (algorithm == ConvAlgorithm::kAuto && wide)))
    algorithms.insert(algorithms.begin(), dnnl::algorithm::convolution_winograd);

  struct Candidate {
    memory::desc src, dst;
    Layout dst_layout;  // the output tensor's layout
  };
  auto dst_in = [&](Layout layout) { return activation_md(g.batch, g.out_channels, g.out_h(), g.out_w(), layout); };
  const memory::desc any_src(src_md.get_dims(), dt::f32, tag::any),
      any_dst(dst_in(g.dst_layout).get_dims(), dt::f32, tag::any);
  const memory::desc nhwc_src = activation_md(g.batch, g.in_channels, g.in_h, g.in_w, Layout::kChannelsLast);
  const std::vector<Candidate> candidates{{src_md, dst_in(g.dst_layout), g.dst_layout},
                                          {any_src, dst_in(g.dst_layout), g.dst_layout},
                                          {src_md, dst_in(Layout::kChannelsLast), Layout::kChannelsLast},
                                          {nhwc_src, dst_in(Layout::kChannelsLast), Layout::kChannelsLast},
                                          {any_src, any_dst, Layout::kChannelsLast}};
  std::optional<ConvPrimitiveDescs> fallback;
  for (dnnl::algorithm algo : algorithms)
    for (const auto& [src, dst, dst_layout] : candidates) {
      try {
        ConvPrimitiveDescs d{dnnl::convolution_forward::primitive_desc(
                                 engine(), dnnl::prop_kind::forward_training, algo, src, any_w, bias, dst, strides,
                                 pad_l, pad_r, scratchpad_attr()),
                             {}, {}, dst_layout};
        if (algo == dnnl::algorithm::convolution_winograd &&
            std::string(d.fwd.impl_info_str()).find("wino") == std::string::npos)
          continue;
        d.bwd_data = dnnl::convolution_backward_data::primitive_desc(engine(), algo, src, any_w, dst, strides, pad_l,
                                                                     pad_r, d.fwd, scratchpad_attr());
        d.bwd_w = dnnl::convolution_backward_weights::primitive_desc(engine(), algo, src, any_w, bias, dst, strides,
                                                                     pad_l, pad_r, d.fwd, scratchpad_attr());
        if (broken_1x1_backward_weights(g, d.bwd_w)) continue;
        if (!is_reference_impl(d.fwd.impl_info_str()) && !is_reference_impl(d.bwd_data.impl_info_str()) &&
            !is_reference_impl(d.bwd_w.impl_info_str()))
          return d;
        if (!fallback) fallback = d;
      } catch (const dnnl::error&) {  // no implementation at all for this combination
      }
    }
  if (!fallback) throw std::runtime_error("oneDNN has no convolution for this geometry");
  return *fallback;
}

// The same for runtime.precision = bf16 (dnnl_precision.h): the primitives read bf16 copies of the
// input, the weights and the output gradient, and write outputs and input gradients in the tensors'
// formats (fp32, or bf16 where the model keeps bf16 activations: then the copies of the input and
// the gradient are the tensors themselves) and fp32 weight gradients (oneDNN accumulates in fp32). The bf16 copies are made by the reorders that also change
// the layout, so the source layout is always oneDNN's choice (`any`) and costs nothing extra; the
// output is written in the tensor's layout, else channels-last, else oneDNN's choice. Direct only
// (oneDNN has no bf16 Winograd). Asked of oneDNN 2.6 on Sapphire Rapids: its AMX forward
// kernels take channels-last only (a blocked output gets the avx512_bf16 kernel), which is why the
// activation layout is probed with a bf16 convolution in this mode (dnnl_dispatch.cpp).
ConvPrimitiveDescs choose_bf16_conv_primitives(const ConvGeometry& g, const memory::desc& src_md,
                                               const memory::desc& bias_md) {
  const memory::dims strides{g.stride_h, g.stride_w};
  const memory::dims pad_l{g.pad_h, g.pad_w};
  const memory::dims pad_r{(g.out_h() - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_h,
                           (g.out_w() - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_w};
  const memory::dims w_dims{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  const memory::desc bf16_w(w_dims, dt::bf16, tag::any), f32_w(w_dims, dt::f32, tag::any);
  const memory::desc bias = g.bias ? bias_md : memory::desc();
  // The input gradient and the output in the tensors' own formats (fp32, or bf16 activations).
  const dt src_dt = src_md.get_data_type(), dst_dt = g.dst_dtype == DType::kBf16 ? dt::bf16 : dt::f32;
  const memory::desc bf16_src(src_md.get_dims(), dt::bf16, tag::any), any_src(src_md.get_dims(), src_dt, tag::any);
  auto dst_in = [&](Layout layout) {
    return activation_md(g.batch, g.out_channels, g.out_h(), g.out_w(), layout, g.dst_dtype);
  };
  const memory::desc bf16_dst(dst_in(g.dst_layout).get_dims(), dt::bf16, tag::any);
  const memory::desc any_dst(dst_in(g.dst_layout).get_dims(), dst_dt, tag::any);
  const auto direct = dnnl::algorithm::convolution_direct;

  struct Candidate {
    memory::desc dst;
    Layout dst_layout;
  };
  const std::vector<Candidate> candidates{{dst_in(g.dst_layout), g.dst_layout},
                                          {dst_in(Layout::kChannelsLast), Layout::kChannelsLast},
                                          {any_dst, Layout::kChannelsLast}};
  std::optional<ConvPrimitiveDescs> fallback;
  for (const auto& [dst, dst_layout] : candidates)
    for (const memory::desc& diff_src : {src_md, any_src}) {  // the input gradient in the tensor's layout first
      try {
        ConvPrimitiveDescs d{dnnl::convolution_forward::primitive_desc(
                                 engine(), dnnl::prop_kind::forward_training, direct, bf16_src, bf16_w, bias, dst,
                                 strides, pad_l, pad_r, scratchpad_attr()),
                             {}, {}, dst_layout};
        d.bwd_data = dnnl::convolution_backward_data::primitive_desc(engine(), direct, diff_src, bf16_w, bf16_dst,
                                                                     strides, pad_l, pad_r, d.fwd, scratchpad_attr());
        d.bwd_w = dnnl::convolution_backward_weights::primitive_desc(engine(), direct, bf16_src, f32_w, bias, bf16_dst,
                                                                     strides, pad_l, pad_r, d.fwd, scratchpad_attr());
        if (!is_reference_impl(d.fwd.impl_info_str()) && !is_reference_impl(d.bwd_data.impl_info_str()) &&
            !is_reference_impl(d.bwd_w.impl_info_str()))
          return d;
        if (!fallback) fallback = d;
      } catch (const dnnl::error&) {  // no implementation at all for this combination
      }
    }
  if (!fallback) throw std::runtime_error("oneDNN has no bf16 convolution for this geometry");
  return *fallback;
}

class DnnlConv final : public ConvOp {
 public:
  DnnlConv(const ConvGeometry& g, const BackendSettings& settings) : g_(g) {
    const bool in_bf16 = settings.precision == Precision::kBf16;
    src_md_ = activation_md(g.batch, g.in_channels, g.in_h, g.in_w, g.src_layout, g.src_dtype);
    if ((g.src_dtype == DType::kBf16 || g.dst_dtype == DType::kBf16) && !in_bf16)
      throw std::logic_error("convolution: bf16 activations need runtime.precision = bf16");
    user_w_md_ = memory::desc({g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, dt::f32, tag::oihw);
    bias_md_ = memory::desc({g.out_channels}, dt::f32, tag::x);
    ConvPrimitiveDescs chosen = in_bf16 ? choose_bf16_conv_primitives(g, src_md_, bias_md_)
                                        : choose_conv_primitives(g, src_md_, bias_md_, settings.conv_algorithm);
    fwd_pd_ = chosen.fwd;
    bwd_data_pd_ = chosen.bwd_data;
    bwd_w_pd_ = chosen.bwd_w;
    dst_layout_ = chosen.dst_layout;
    const memory::desc user_dst =
        activation_md(g.batch, g.out_channels, g.out_h(), g.out_w(), dst_layout_, g.dst_dtype);
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
    bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd_);

    // The kind names the precision the primitives got ("conv fwd bf16"), for the dispatch test.
    bf16_ = fwd_pd_.weights_desc().get_data_type() == dt::bf16;
    const std::string bf16 = bf16_ ? " bf16" : "";
    report(("conv fwd" + bf16).c_str(), fwd_pd_, src_md_, g.src_layout);
    report(("conv bwd_d" + bf16).c_str(), bwd_data_pd_, src_md_, g.src_layout);
    report(("conv bwd_w" + bf16).c_str(), bwd_w_pd_, src_md_, g.src_layout);
    fwd_src_.prepare(src_md_, fwd_pd_.src_desc());
    fwd_dst_.prepare(user_dst, fwd_pd_.dst_desc());
    bwd_data_dst_.prepare(user_dst, bwd_data_pd_.diff_dst_desc());
    bwd_w_dst_.prepare(user_dst, bwd_w_pd_.diff_dst_desc());
    bwd_w_src_.prepare(src_md_, bwd_w_pd_.src_desc());
    diff_src_.prepare(src_md_, bwd_data_pd_.diff_src_desc());
    fwd_w_.prepare(user_w_md_, fwd_pd_.weights_desc());
    bwd_w_in_.prepare(user_w_md_, bwd_data_pd_.weights_desc());
    diff_w_.prepare(user_w_md_, bwd_w_pd_.diff_weights_desc());
  }

  Layout output_layout() const override { return dst_layout_; }

  void forward(const float* x, const float* w, const float* b, float* y) override {
    memory src = fwd_src_.in(x);
    bf16_x_ = bf16_ ? x : nullptr;
    bf16_dy_ = nullptr;
    memory dst = fwd_dst_.out(y);
    memory wm = fwd_w_.in(w);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dst}};
    if (g_.bias) args.insert({DNNL_ARG_BIAS, memory(bias_md_, engine(), const_cast<float*>(b))});
    execute(fwd_, fwd_pd_, std::move(args));
    fwd_dst_.out_done(y);
  }

  void backward_data(const float* dy, const float* w, float* dx) override {
    // (A copy that was never made, the gradient being in the wanted format already, is not reused.)
    const bool reuse_dy = dy == bf16_dy_ && bwd_data_dst_.want == bwd_w_dst_.want && !bwd_w_dst_.same();
    memory diff_dst = reuse_dy ? bwd_w_dst_.mem : bwd_data_dst_.in(dy);
    bf16_dy_ = nullptr;  // once: a second call may bring other values in the same buffer
    memory diff_src = diff_src_.out(dx);
    // Forward already reordered these weights; reuse that copy when backward wants the same layout.
    memory wm;
    if (bwd_w_in_.want != fwd_w_.want) wm = bwd_w_in_.in(w);
    else if (fwd_w_.same()) wm = memory(user_w_md_, engine(), const_cast<float*>(w));
    else wm = fwd_w_.mem;
    execute(bwd_data_, bwd_data_pd_, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, diff_src}});
    diff_src_.out_done(dx);
  }

  // In bf16, the bf16 copies are reused where backward wants them in the layout they were made in:
  // x's from forward (backward_weights takes the forward's input, unchanged since), and dy's from
  // backward_weights in the backward_data right after it on the same dy (the layer's order).
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const bool reuse_x = x == bf16_x_ && bwd_w_src_.want == fwd_src_.want && !fwd_src_.same();
    memory src = reuse_x ? fwd_src_.mem : bwd_w_src_.in(x);
    memory diff_dst = bwd_w_dst_.in(dy);
    bf16_dy_ = bf16_ ? dy : nullptr;
    memory dwm = diff_w_.out(dw);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst},
                                         {DNNL_ARG_DIFF_WEIGHTS, dwm}};
    if (g_.bias) args.insert({DNNL_ARG_DIFF_BIAS, memory(bias_md_, engine(), db)});
    execute(bwd_w_, bwd_w_pd_, std::move(args));
    diff_w_.out_done(dw);
  }

 private:
  ConvGeometry g_;
  Layout dst_layout_ = Layout::kChannelsLast;
  memory::desc src_md_, user_w_md_, bias_md_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::convolution_backward_weights bwd_w_;
  Staged fwd_src_, bwd_w_src_, diff_src_, fwd_w_, bwd_w_in_, diff_w_;
  Staged fwd_dst_, bwd_data_dst_, bwd_w_dst_;  // copies only where the output layout is oneDNN's own
  bool bf16_ = false;
  const float* bf16_x_ = nullptr;   // the input whose bf16 copy fwd_src_ holds
  const float* bf16_dy_ = nullptr;  // the gradient whose bf16 copy bwd_w_dst_ holds
};

class DnnlBatchNorm final : public BatchNormOp {
 public:
  explicit DnnlBatchNorm(const BatchNormGeometry& g) : g_(g) {
    md_ = activation_md(g.batch, g.channels, g.h, g.w, g.layout, g.dtype);
    stat_md_ = memory::desc({g.channels}, dt::f32, tag::x);
    using flags = dnnl::normalization_flags;
    auto f = flags::use_scale | flags::use_shift;
    if (g.fuse_relu) f = f | flags::fuse_norm_relu;
    // Frozen statistics: training normalizes with the given (running) mean and variance, which are
    // inputs, and backward treats them as constants.
    if (g.frozen_stats) f = f | flags::use_global_stats;
    train_pd_ = dnnl::batch_normalization_forward::primitive_desc(engine(), dnnl::prop_kind::forward_training, md_,
                                                                  md_, g.eps, f, scratchpad_attr());
    train_ = dnnl::batch_normalization_forward(train_pd_);

    // (with frozen_stats, f already holds use_global_stats)
    infer_pd_ = dnnl::batch_normalization_forward::primitive_desc(engine(), dnnl::prop_kind::forward_inference, md_,
                                                                  md_, g.eps, f | flags::use_global_stats,
                                                                  scratchpad_attr());
    infer_ = dnnl::batch_normalization_forward(infer_pd_);

    bwd_pd_ = dnnl::batch_normalization_backward::primitive_desc(engine(), dnnl::prop_kind::backward, md_, md_, md_,
                                                                 g.eps, f, train_pd_, scratchpad_attr());
    bwd_ = dnnl::batch_normalization_backward(bwd_pd_);
    report("bnorm fwd", train_pd_, md_, g.layout);
    report("bnorm fwd_i", infer_pd_, md_, g.layout);
    report("bnorm bwd", bwd_pd_, md_, g.layout);
    if (g.fuse_relu) {
      workspace_buf_.resize(static_cast<int64_t>(train_pd_.workspace_desc().get_size() / sizeof(float)) + 1);
      workspace_ = memory(train_pd_.workspace_desc(), engine(), workspace_buf_.data());
    }
  }

  void forward_training(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* var) override {
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(md_, x)},         {DNNL_ARG_DST, mem(md_, y)},
        {DNNL_ARG_SCALE, mem(stat_md_, gamma)}, {DNNL_ARG_SHIFT, mem(stat_md_, beta)},
        {DNNL_ARG_MEAN, mem(stat_md_, mean)}, {DNNL_ARG_VARIANCE, mem(stat_md_, var)}};
    if (g_.fuse_relu) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    execute(train_, train_pd_, std::move(args));
  }

  void forward_inference(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* var, float* y) override {
    execute(infer_, infer_pd_,
            {{DNNL_ARG_SRC, mem(md_, x)}, {DNNL_ARG_DST, mem(md_, y)}, {DNNL_ARG_SCALE, mem(stat_md_, gamma)},
             {DNNL_ARG_SHIFT, mem(stat_md_, beta)}, {DNNL_ARG_MEAN, mem(stat_md_, mean)},
             {DNNL_ARG_VARIANCE, mem(stat_md_, var)}});
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* /*beta*/, const float* mean,
                const float* var, float* dx, float* dgamma, float* dbeta) override {
    // No shift: oneDNN 3.2's backward reads none (a fused ReLU's mask is in the workspace) and
    // refuses one (its input count leaves it out, though its argument table lists it).
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(md_, x)},           {DNNL_ARG_DIFF_DST, mem(md_, dy)},
        {DNNL_ARG_MEAN, mem(stat_md_, mean)},   {DNNL_ARG_VARIANCE, mem(stat_md_, var)},
        {DNNL_ARG_SCALE, mem(stat_md_, gamma)},
        {DNNL_ARG_DIFF_SRC, mem(md_, dx)},
        {DNNL_ARG_DIFF_SCALE, mem(stat_md_, dgamma)}, {DNNL_ARG_DIFF_SHIFT, mem(stat_md_, dbeta)}};
    if (g_.fuse_relu) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    execute(bwd_, bwd_pd_, std::move(args));
  }

 private:
  static memory mem(const memory::desc& md, const float* p) {
    return memory(md, engine(), const_cast<float*>(p));
  }
  BatchNormGeometry g_;
  memory::desc md_, stat_md_;
  dnnl::batch_normalization_forward::primitive_desc train_pd_, infer_pd_;
  dnnl::batch_normalization_forward train_, infer_;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd_;
  dnnl::batch_normalization_backward bwd_;
  HostBuffer workspace_buf_;
  memory workspace_;
};

class DnnlPool final : public PoolOp {
 public:
  explicit DnnlPool(const PoolGeometry& g) : g_(g) {
    src_md_ = activation_md(g.batch, g.channels, g.in_h, g.in_w, g.layout, g.dtype);
    dst_md_ = activation_md(g.batch, g.channels, g.out_h(), g.out_w(), g.layout, g.dtype);
    const auto algo = g.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                               : dnnl::algorithm::pooling_avg_exclude_padding;
    const memory::dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w};
    const memory::dims pad_l{g.pad_h, g.pad_w}, no_dilation{0, 0};
    const memory::dims pad_r{(g.out_h() - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_h,
                             (g.out_w() - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_w};
    fwd_pd_ = dnnl::pooling_forward::primitive_desc(engine(), dnnl::prop_kind::forward_training, algo, src_md_,
                                                    dst_md_, strides, kernel, no_dilation, pad_l, pad_r,
                                                    scratchpad_attr());
    fwd_ = dnnl::pooling_forward(fwd_pd_);
    infer_pd_ = dnnl::pooling_forward::primitive_desc(engine(), dnnl::prop_kind::forward_inference, algo, src_md_,
                                                      dst_md_, strides, kernel, no_dilation, pad_l, pad_r,
                                                      scratchpad_attr());
    infer_ = dnnl::pooling_forward(infer_pd_);
    bwd_pd_ = dnnl::pooling_backward::primitive_desc(engine(), algo, src_md_, dst_md_, strides, kernel, no_dilation,
                                                     pad_l, pad_r, fwd_pd_, scratchpad_attr());
    bwd_ = dnnl::pooling_backward(bwd_pd_);
    report("pool fwd", fwd_pd_, src_md_, g.layout);
    report("pool fwd_i", infer_pd_, src_md_, g.layout);
    report("pool bwd", bwd_pd_, src_md_, g.layout);
    if (g.kind == PoolKind::kMax) {
      workspace_buf_.resize(static_cast<int64_t>(fwd_pd_.workspace_desc().get_size() / sizeof(float)) + 1);
      workspace_ = memory(fwd_pd_.workspace_desc(), engine(), workspace_buf_.data());
    }
  }

  void forward(const float* x, float* y, bool training) override {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md_, engine(), const_cast<float*>(x))},
                                         {DNNL_ARG_DST, memory(dst_md_, engine(), y)}};
    if (training && g_.kind == PoolKind::kMax) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    if (training) execute(fwd_, fwd_pd_, std::move(args));
    else execute(infer_, infer_pd_, std::move(args));
  }

  void backward(const float* dy, float* dx) override {
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, memory(dst_md_, engine(), const_cast<float*>(dy))},
                                         {DNNL_ARG_DIFF_SRC, memory(src_md_, engine(), dx)}};
    if (g_.kind == PoolKind::kMax) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    execute(bwd_, bwd_pd_, std::move(args));
  }

 private:
  PoolGeometry g_;
  memory::desc src_md_, dst_md_;
  dnnl::pooling_forward::primitive_desc fwd_pd_, infer_pd_;
  dnnl::pooling_forward fwd_, infer_;
  dnnl::pooling_backward::primitive_desc bwd_pd_;
  dnnl::pooling_backward bwd_;
  HostBuffer workspace_buf_;
  memory workspace_;
};

}  // namespace

// The same engine, stream and scratchpad for ops in other files (dnnl_context.h).
dnnl::engine& dnnl_engine() { return engine(); }
dnnl::stream& dnnl_stream() { return stream(); }
dnnl::primitive_attr dnnl_scratchpad_attr() { return scratchpad_attr(); }
dnnl::memory dnnl_scratchpad(const dnnl::memory::desc& md) { return scratchpad(md); }

dnnl::memory::desc activation_md(int64_t n, int64_t c, int64_t h, int64_t w, Layout layout, DType dtype) {
  tag t = tag::nhwc;
  if (layout == Layout::kBlocked8) t = tag::nChw8c;
  if (layout == Layout::kBlocked16) t = tag::nChw16c;
  return memory::desc({n, c, h, w}, dtype == DType::kBf16 ? dt::bf16 : dt::f32, t);
}

void reorder_layout(const Tensor& x, Tensor& y) {
  if (x.shape != y.shape || x.dtype != y.dtype) throw std::logic_error("convert_layout: shapes or dtypes differ");
  memory src(activation_md(x.dim(0), x.dim(1), x.dim(2), x.dim(3), x.layout, x.dtype), engine(), x.data);
  memory dst(activation_md(y.dim(0), y.dim(1), y.dim(2), y.dim(3), y.layout, y.dtype), engine(), y.data);
  dnnl::reorder(src, dst).execute(stream(), src, dst);
  stream().wait();
}

void reorder_nchw(const Tensor& t, float* nchw, bool to_nchw) {
  const memory::dims dims{t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
  // A bf16 tensor is widened on the way out and rounded to nearest even on the way in.
  memory tensor_mem(activation_md(t.dim(0), t.dim(1), t.dim(2), t.dim(3), t.layout, t.dtype), engine(), t.data);
  memory nchw_mem(memory::desc(dims, dt::f32, tag::nchw), engine(), nchw);
  if (to_nchw) dnnl::reorder(tensor_mem, nchw_mem).execute(stream(), tensor_mem, nchw_mem);
  else dnnl::reorder(nchw_mem, tensor_mem).execute(stream(), nchw_mem, tensor_mem);
  stream().wait();
}

std::unique_ptr<ConvOp> make_dnnl_conv(const ConvGeometry& g, const BackendSettings& settings) {
  return std::make_unique<DnnlConv>(g, settings);
}
std::unique_ptr<BatchNormOp> make_dnnl_batchnorm(const BatchNormGeometry& g) {
  return std::make_unique<DnnlBatchNorm>(g);
}
std::unique_ptr<PoolOp> make_dnnl_pool(const PoolGeometry& g) { return std::make_unique<DnnlPool>(g); }

}  // namespace trainer::models::cpu
