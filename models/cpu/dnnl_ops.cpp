#include "models/cpu/dnnl_ops.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <unordered_map>

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

ConvAlgorithm g_conv_algorithm = ConvAlgorithm::kDirect;

// A buffer in a primitive's preferred layout, plus the reorder from (or to) the user's layout.
// Reordering is skipped when the layouts already agree.
struct Staged {
  memory::desc want;
  HostBuffer storage;
  memory mem;

  void prepare(const memory::desc& preferred) {
    want = preferred;
    storage.resize(static_cast<int64_t>(want.get_size() / sizeof(float)) + 1);
    mem = memory(want, engine(), storage.data());
  }
  // Returns a memory in the preferred layout holding `user` (reordering into storage if needed).
  memory in(const memory::desc& user_md, const float* user) {
    memory u(user_md, engine(), const_cast<float*>(user));
    if (user_md == want) return u;
    dnnl::reorder(u, mem).execute(stream(), u, mem);
    return mem;
  }
  // Memory to compute into; call out_done afterwards to move it to the user's buffer.
  memory out(const memory::desc& user_md, float* user) {
    if (user_md == want) return memory(user_md, engine(), user);
    return mem;
  }
  void out_done(const memory::desc& user_md, float* user) {
    if (user_md == want) return;
    memory u(user_md, engine(), user);
    dnnl::reorder(mem, u).execute(stream(), mem, u);
  }
};

memory::desc nhwc(int64_t n, int64_t c, int64_t h, int64_t w) {
  return memory::desc({n, c, h, w}, dt::f32, tag::nhwc);
}

class DnnlConv final : public ConvOp {
 public:
  explicit DnnlConv(const ConvGeometry& g) : g_(g) {
    const memory::dims strides{g.stride_h, g.stride_w};
    const memory::dims pad_l{g.pad_h, g.pad_w};
    // Right padding so the output size is exactly what the geometry says (floor division).
    const memory::dims pad_r{(g.out_h() - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_h,
                             (g.out_w() - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_w};
    src_md_ = nhwc(g.batch, g.in_channels, g.in_h, g.in_w);
    dst_md_ = nhwc(g.batch, g.out_channels, g.out_h(), g.out_w());
    user_w_md_ = memory::desc({g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, dt::f32, tag::oihw);
    bias_md_ = memory::desc({g.out_channels}, dt::f32, tag::x);
    const memory::desc any_w({g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, dt::f32, tag::any);
    const memory::desc no_bias;

    dnnl::algorithm algo = dnnl::algorithm::convolution_direct;
    const bool winograd_shape = g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1;
    if (g_conv_algorithm == ConvAlgorithm::kAuto) algo = dnnl::algorithm::convolution_auto;
    if (g_conv_algorithm == ConvAlgorithm::kWinograd && winograd_shape)
      algo = dnnl::algorithm::convolution_winograd;

    auto make_fwd = [&](dnnl::algorithm a) {
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, a, src_md_, any_w,
                                        g.bias ? bias_md_ : no_bias, dst_md_, strides, pad_l, pad_r);
      return dnnl::convolution_forward::primitive_desc(d, engine());
    };
    try {
      fwd_pd_ = make_fwd(algo);
    } catch (const dnnl::error&) {  // e.g. Winograd unsupported for this shape or ISA
      algo = dnnl::algorithm::convolution_direct;
      fwd_pd_ = make_fwd(algo);
    }
    fwd_ = dnnl::convolution_forward(fwd_pd_);

    dnnl::convolution_backward_data::desc bd(algo, src_md_, any_w, dst_md_, strides, pad_l, pad_r);
    bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(bd, engine(), fwd_pd_);
    bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);

    dnnl::convolution_backward_weights::desc bw(algo, src_md_, any_w, g.bias ? bias_md_ : no_bias,
                                                dst_md_, strides, pad_l, pad_r);
    bwd_w_pd_ = dnnl::convolution_backward_weights::primitive_desc(bw, engine(), fwd_pd_);
    bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd_);

    fwd_w_.prepare(fwd_pd_.weights_desc());
    bwd_w_in_.prepare(bwd_data_pd_.weights_desc());
    diff_w_.prepare(bwd_w_pd_.diff_weights_desc());
  }

  void forward(const float* x, const float* w, const float* b, float* y) override {
    memory src(src_md_, engine(), const_cast<float*>(x));
    memory dst(dst_md_, engine(), y);
    memory wm = fwd_w_.in(user_w_md_, w);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dst}};
    if (g_.bias) args.insert({DNNL_ARG_BIAS, memory(bias_md_, engine(), const_cast<float*>(b))});
    fwd_.execute(stream(), args);
    stream().wait();
  }

  void backward_data(const float* dy, const float* w, float* dx) override {
    memory diff_dst(dst_md_, engine(), const_cast<float*>(dy));
    memory diff_src(src_md_, engine(), dx);
    // Forward already reordered these weights; reuse that copy when backward wants the same layout.
    memory wm;
    if (bwd_w_in_.want != fwd_w_.want) wm = bwd_w_in_.in(user_w_md_, w);
    else if (user_w_md_ == fwd_w_.want) wm = memory(user_w_md_, engine(), const_cast<float*>(w));
    else wm = fwd_w_.mem;
    bwd_data_.execute(stream(), {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wm},
                                 {DNNL_ARG_DIFF_SRC, diff_src}});
    stream().wait();
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    memory src(src_md_, engine(), const_cast<float*>(x));
    memory diff_dst(dst_md_, engine(), const_cast<float*>(dy));
    memory dwm = diff_w_.out(user_w_md_, dw);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst},
                                         {DNNL_ARG_DIFF_WEIGHTS, dwm}};
    if (g_.bias) args.insert({DNNL_ARG_DIFF_BIAS, memory(bias_md_, engine(), db)});
    bwd_w_.execute(stream(), args);
    diff_w_.out_done(user_w_md_, dw);
    stream().wait();
  }

 private:
  ConvGeometry g_;
  memory::desc src_md_, dst_md_, user_w_md_, bias_md_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::convolution_backward_weights bwd_w_;
  Staged fwd_w_, bwd_w_in_, diff_w_;
};

class DnnlBatchNorm final : public BatchNormOp {
 public:
  explicit DnnlBatchNorm(const BatchNormGeometry& g) : g_(g) {
    md_ = nhwc(g.batch, g.channels, g.h, g.w);
    stat_md_ = memory::desc({g.channels}, dt::f32, tag::x);
    using flags = dnnl::normalization_flags;
    auto f = flags::use_scale | flags::use_shift;
    if (g.fuse_relu) f = f | flags::fuse_norm_relu;
    dnnl::batch_normalization_forward::desc train_d(dnnl::prop_kind::forward_training, md_, g.eps, f);
    train_pd_ = dnnl::batch_normalization_forward::primitive_desc(train_d, engine());
    train_ = dnnl::batch_normalization_forward(train_pd_);

    dnnl::batch_normalization_forward::desc infer_d(dnnl::prop_kind::forward_inference, md_, g.eps,
                                                    f | flags::use_global_stats);
    infer_pd_ = dnnl::batch_normalization_forward::primitive_desc(infer_d, engine());
    infer_ = dnnl::batch_normalization_forward(infer_pd_);

    dnnl::batch_normalization_backward::desc bwd_d(dnnl::prop_kind::backward, md_, md_, g.eps, f);
    bwd_pd_ = dnnl::batch_normalization_backward::primitive_desc(bwd_d, engine(), train_pd_);
    bwd_ = dnnl::batch_normalization_backward(bwd_pd_);
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
    train_.execute(stream(), args);
    stream().wait();
  }

  void forward_inference(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* var, float* y) override {
    infer_.execute(stream(), {{DNNL_ARG_SRC, mem(md_, x)},
                              {DNNL_ARG_DST, mem(md_, y)},
                              {DNNL_ARG_SCALE, mem(stat_md_, gamma)},
                              {DNNL_ARG_SHIFT, mem(stat_md_, beta)},
                              {DNNL_ARG_MEAN, mem(stat_md_, mean)},
                              {DNNL_ARG_VARIANCE, mem(stat_md_, var)}});
    stream().wait();
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean,
                const float* var, float* dx, float* dgamma, float* dbeta) override {
    // oneDNN's channels-last backward also reads beta (it recomputes the fused ReLU's input).
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(md_, x)},           {DNNL_ARG_DIFF_DST, mem(md_, dy)},
        {DNNL_ARG_MEAN, mem(stat_md_, mean)},   {DNNL_ARG_VARIANCE, mem(stat_md_, var)},
        {DNNL_ARG_SCALE, mem(stat_md_, gamma)}, {DNNL_ARG_SHIFT, mem(stat_md_, beta)},
        {DNNL_ARG_DIFF_SRC, mem(md_, dx)},
        {DNNL_ARG_DIFF_SCALE, mem(stat_md_, dgamma)}, {DNNL_ARG_DIFF_SHIFT, mem(stat_md_, dbeta)}};
    if (g_.fuse_relu) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    bwd_.execute(stream(), args);
    stream().wait();
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
    src_md_ = nhwc(g.batch, g.channels, g.in_h, g.in_w);
    dst_md_ = nhwc(g.batch, g.channels, g.out_h(), g.out_w());
    const auto algo = g.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                               : dnnl::algorithm::pooling_avg_exclude_padding;
    const memory::dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w};
    const memory::dims pad_l{g.pad_h, g.pad_w};
    const memory::dims pad_r{(g.out_h() - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_h,
                             (g.out_w() - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_w};
    dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, algo, src_md_, dst_md_, strides,
                                   kernel, pad_l, pad_r);
    fwd_pd_ = dnnl::pooling_forward::primitive_desc(fd, engine());
    fwd_ = dnnl::pooling_forward(fwd_pd_);
    dnnl::pooling_forward::desc id(dnnl::prop_kind::forward_inference, algo, src_md_, dst_md_, strides,
                                   kernel, pad_l, pad_r);
    infer_ = dnnl::pooling_forward(dnnl::pooling_forward::primitive_desc(id, engine()));
    dnnl::pooling_backward::desc bd(algo, src_md_, dst_md_, strides, kernel, pad_l, pad_r);
    bwd_ = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(bd, engine(), fwd_pd_));
    if (g.kind == PoolKind::kMax) {
      workspace_buf_.resize(static_cast<int64_t>(fwd_pd_.workspace_desc().get_size() / sizeof(float)) + 1);
      workspace_ = memory(fwd_pd_.workspace_desc(), engine(), workspace_buf_.data());
    }
  }

  void forward(const float* x, float* y, bool training) override {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md_, engine(), const_cast<float*>(x))},
                                         {DNNL_ARG_DST, memory(dst_md_, engine(), y)}};
    if (training && g_.kind == PoolKind::kMax) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    (training ? fwd_ : infer_).execute(stream(), args);
    stream().wait();
  }

  void backward(const float* dy, float* dx) override {
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, memory(dst_md_, engine(), const_cast<float*>(dy))},
                                         {DNNL_ARG_DIFF_SRC, memory(src_md_, engine(), dx)}};
    if (g_.kind == PoolKind::kMax) args.insert({DNNL_ARG_WORKSPACE, workspace_});
    bwd_.execute(stream(), args);
    stream().wait();
  }

 private:
  PoolGeometry g_;
  memory::desc src_md_, dst_md_;
  dnnl::pooling_forward::primitive_desc fwd_pd_;
  dnnl::pooling_forward fwd_, infer_;
  dnnl::pooling_backward bwd_;
  HostBuffer workspace_buf_;
  memory workspace_;
};

}  // namespace

void set_conv_algorithm(ConvAlgorithm algorithm) { g_conv_algorithm = algorithm; }

std::unique_ptr<ConvOp> make_dnnl_conv(const ConvGeometry& g) { return std::make_unique<DnnlConv>(g); }
std::unique_ptr<BatchNormOp> make_dnnl_batchnorm(const BatchNormGeometry& g) {
  return std::make_unique<DnnlBatchNorm>(g);
}
std::unique_ptr<PoolOp> make_dnnl_pool(const PoolGeometry& g) { return std::make_unique<DnnlPool>(g); }

}  // namespace trainer::models::cpu
