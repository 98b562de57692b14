// The oneDNN LSTM (see lstm_ops.h): one vanilla_lstm primitive per direction and layer,
// unidirectional left-to-right from a zero state, forward_training + backward.
//
// PyTorch's weight layouts are oneDNN's ldgoi format ({4H, I} = gates x outputs x inputs) and its
// gate order (i, f, g, o) is oneDNN's, so the user-side memory is the parameter buffer itself;
// the primitives want their own packed layouts, reached by reorders made once and run once per
// forward and once per backward. oneDNN has one bias; PyTorch's two are summed (and both get its
// gradient). The backward accumulates into its weight gradients, so they are zeroed first.
// Initial-state gradients are computed (the API wants them with explicit initial states) and dropped.
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>

#include "models/cpu/dnnl_context.h"
#include "models/cpu/dnnl_staged.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/cpu/lstm_ops.h"
#include "models/tensor.h"

namespace trainer::models::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

class DnnlLstm final : public LstmDirectionOp {
 public:
  explicit DnnlLstm(const LstmDirectionGeometry& g) : g_(g) {
    const int64_t T = g.seq_len, N = g.batch, I = g.input, H = g.hidden;
    src_md_ = memory::desc({T, N, I}, dt::f32, tag::tnc);
    dst_md_ = memory::desc({T, N, H}, dt::f32, tag::tnc);
    bias_md_ = memory::desc({1, 1, 4, H}, dt::f32, tag::ldgo);
    const memory::desc user_wl({1, 1, I, 4, H}, dt::f32, tag::ldgoi);
    const memory::desc user_wi({1, 1, H, 4, H}, dt::f32, tag::ldgoi);
    const memory::desc any_wl({1, 1, I, 4, H}, dt::f32, tag::any);
    const memory::desc any_wi({1, 1, H, 4, H}, dt::f32, tag::any);
    const memory::desc none;
    const auto dir = dnnl::rnn_direction::unidirectional_left2right;

    // The zero initial state is passed explicitly: with a zero src_iter descriptor (which the
    // documentation allows), oneDNN 2.6's backward took the t = 0 term of diff_weights_iter from an
    // uninitialized state (the recurrent weight gradients disagreed with finite differences).
    state_md_ = memory::desc({1, 1, N, H}, dt::f32, tag::ldnc);
    const memory::desc& h0 = state_md_;
    dnnl::lstm_forward::desc fd(dnnl::prop_kind::forward_training, dir, src_md_, h0, h0, any_wl, any_wi, bias_md_,
                                dst_md_, none, none);
    fwd_pd_ = dnnl::lstm_forward::primitive_desc(fd, dnnl_scratchpad_attr(), dnnl_engine());
    fwd_ = dnnl::lstm_forward(fwd_pd_);
    dnnl::lstm_backward::desc bd(dnnl::prop_kind::backward, dir, src_md_, h0, h0, any_wl, any_wi, bias_md_, dst_md_,
                                 none, none, src_md_, h0, h0, any_wl, any_wi, bias_md_, dst_md_, none, none);
    bwd_pd_ = dnnl::lstm_backward::primitive_desc(bd, dnnl_scratchpad_attr(), dnnl_engine(), fwd_pd_);
    bwd_ = dnnl::lstm_backward(bwd_pd_);
    const std::string shape = "T" + std::to_string(g.seq_len) + " N" + std::to_string(N) + " I" + std::to_string(I) +
                              " H" + std::to_string(H);
    record_primitive("lstm fwd", shape, fwd_pd_.impl_info_str());
    record_primitive("lstm bwd", shape, bwd_pd_.impl_info_str());

    fwd_wl_.prepare(user_wl, fwd_pd_.weights_layer_desc());
    fwd_wi_.prepare(user_wi, fwd_pd_.weights_iter_desc());
    bwd_wl_.prepare(user_wl, bwd_pd_.weights_layer_desc());
    bwd_wi_.prepare(user_wi, bwd_pd_.weights_iter_desc());
    diff_wl_.prepare(user_wl, bwd_pd_.diff_weights_layer_desc());
    diff_wi_.prepare(user_wi, bwd_pd_.diff_weights_iter_desc());
    workspace_buf_.resize(static_cast<int64_t>(fwd_pd_.workspace_desc().get_size() / sizeof(float)) + 1);
    workspace_ = memory(fwd_pd_.workspace_desc(), dnnl_engine(), workspace_buf_.data());
    bias_.resize(4 * H);
    dbias_.resize(4 * H);
    zero_state_.resize(N * H);
    std::memset(zero_state_.data(), 0, sizeof(float) * N * H);
    diff_state_.resize(2 * N * H);
  }

  void forward(const float* x, const float* w_ih, const float* w_hh, const float* b_ih, const float* b_hh,
               float* y, bool) override {
    // Inference runs the training primitive too: one set of packed weights, and the workspace it
    // fills is small next to the GEMMs.
    for (int64_t j = 0; j < 4 * g_.hidden; ++j) bias_.data()[j] = b_ih[j] + b_hh[j];
    run(fwd_, fwd_pd_.scratchpad_desc(),
        {{DNNL_ARG_SRC_LAYER, mem(src_md_, x)},
         {DNNL_ARG_WEIGHTS_LAYER, fwd_wl_.in(w_ih)},
         {DNNL_ARG_WEIGHTS_ITER, fwd_wi_.in(w_hh)},
         {DNNL_ARG_BIAS, mem(bias_md_, bias_.data())},
         {DNNL_ARG_DST_LAYER, mem(dst_md_, y)},
         {DNNL_ARG_SRC_ITER, mem(state_md_, zero_state_.data())},
         {DNNL_ARG_SRC_ITER_C, mem(state_md_, zero_state_.data())},
         {DNNL_ARG_WORKSPACE, workspace_}});
  }

  void backward(const float* x, const float* w_ih, const float* w_hh, const float* y, const float* dy, float* dx,
                float* dw_ih, float* dw_hh, float* db_ih, float* db_hh) override {
    std::memset(dbias_.data(), 0, sizeof(float) * 4 * g_.hidden);
    memory dwl = diff_wl_.zeroed_out(dw_ih), dwi = diff_wi_.zeroed_out(dw_hh);
    run(bwd_, bwd_pd_.scratchpad_desc(),
        {{DNNL_ARG_SRC_LAYER, mem(src_md_, x)},
         {DNNL_ARG_WEIGHTS_LAYER, bwd_wl_.in(w_ih)},
         {DNNL_ARG_WEIGHTS_ITER, bwd_wi_.in(w_hh)},
         {DNNL_ARG_BIAS, mem(bias_md_, bias_.data())},
         {DNNL_ARG_DST_LAYER, mem(dst_md_, y)},
         {DNNL_ARG_DIFF_DST_LAYER, mem(dst_md_, dy)},
         {DNNL_ARG_WORKSPACE, workspace_},
         {DNNL_ARG_DIFF_SRC_LAYER, mem(src_md_, dx)},
         {DNNL_ARG_DIFF_WEIGHTS_LAYER, dwl},
         {DNNL_ARG_DIFF_WEIGHTS_ITER, dwi},
         {DNNL_ARG_SRC_ITER, mem(state_md_, zero_state_.data())},
         {DNNL_ARG_SRC_ITER_C, mem(state_md_, zero_state_.data())},
         {DNNL_ARG_DIFF_SRC_ITER, mem(state_md_, diff_state_.data())},
         {DNNL_ARG_DIFF_SRC_ITER_C, mem(state_md_, diff_state_.data() + g_.batch * g_.hidden)},
         {DNNL_ARG_DIFF_BIAS, mem(bias_md_, dbias_.data())}});
    diff_wl_.out_done(dw_ih);
    diff_wi_.out_done(dw_hh);
    dnnl_stream().wait();
    std::copy(dbias_.data(), dbias_.data() + 4 * g_.hidden, db_ih);
    std::copy(dbias_.data(), dbias_.data() + 4 * g_.hidden, db_hh);
  }

 private:
  static memory mem(const memory::desc& md, const float* p) {
    return memory(md, dnnl_engine(), const_cast<float*>(p));
  }
  static void run(const dnnl::primitive& p, const memory::desc& scratchpad_md,
                  std::unordered_map<int, memory> args) {
    args.insert({DNNL_ARG_SCRATCHPAD, dnnl_scratchpad(scratchpad_md)});
    p.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  }

  LstmDirectionGeometry g_;
  memory::desc src_md_, dst_md_, bias_md_, state_md_;
  dnnl::lstm_forward::primitive_desc fwd_pd_;
  dnnl::lstm_forward fwd_;
  dnnl::lstm_backward::primitive_desc bwd_pd_;
  dnnl::lstm_backward bwd_;
  Staged fwd_wl_, fwd_wi_, bwd_wl_, bwd_wi_, diff_wl_, diff_wi_;
  HostBuffer workspace_buf_, bias_, dbias_, zero_state_, diff_state_;
  memory workspace_;
};

}  // namespace

std::unique_ptr<LstmDirectionOp> make_dnnl_lstm(const LstmDirectionGeometry& g) { return std::make_unique<DnnlLstm>(g); }

}  // namespace trainer::models::cpu
