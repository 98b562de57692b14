// The oneDNN LSTM (see lstm_ops.h): one vanilla_lstm primitive per direction and layer,
// unidirectional left-to-right from a zero state, forward_training + backward.
//
// PyTorch's weight layouts are oneDNN's ldgoi format ({4H, I} = gates x outputs x inputs) and its
// gate order (i, f, g, o) is oneDNN's, so the user-side memory is the parameter buffer itself;
// the primitives want their own packed layouts, reached by reorders made once and run once per
// forward and once per backward. oneDNN has one bias; PyTorch's two are summed (and both get its
// gradient). The backward accumulates into its weight gradients, so they are zeroed first.
// Initial-state gradients are computed (the API wants them with explicit initial states) and dropped.
//
// In bf16 (runtime.precision = bf16, as PyTorch's CPU autocast runs nn.LSTM through oneDNN): the
// primitives read bf16 copies of the input, the initial state and the weights, and write a bf16
// output, which reaches the model widened to fp32; the cell state, the bias and every gradient stay
// fp32 (oneDNN's bf16 RNN takes exactly that). Backward reuses forward's bf16 input and output
// (its inputs are forward's, unchanged since), so a step adds the weight copies and the output's
// widening to the fp32 path's reorders.
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
    const dt compute = g.bf16 ? dt::bf16 : dt::f32;
    src_md_ = memory::desc({T, N, I}, dt::f32, tag::tnc);
    dst_md_ = memory::desc({T, N, H}, dt::f32, tag::tnc);
    const memory::desc src_in({T, N, I}, compute, tag::tnc), dst_out({T, N, H}, compute, tag::tnc);
    bias_md_ = memory::desc({1, 1, 4, H}, dt::f32, tag::ldgo);
    const memory::desc user_wl({1, 1, I, 4, H}, dt::f32, tag::ldgoi);
    const memory::desc user_wi({1, 1, H, 4, H}, dt::f32, tag::ldgoi);
    const memory::desc any_wl({1, 1, I, 4, H}, compute, tag::any), diff_any_wl({1, 1, I, 4, H}, dt::f32, tag::any);
    const memory::desc any_wi({1, 1, H, 4, H}, compute, tag::any), diff_any_wi({1, 1, H, 4, H}, dt::f32, tag::any);
    const memory::desc none;
    const auto dir = dnnl::rnn_direction::unidirectional_left2right;

    // The zero initial state is passed explicitly: with a zero src_iter descriptor (which the
    // documentation allows), oneDNN 2.6's backward took the t = 0 term of diff_weights_iter from an
    // uninitialized state (the recurrent weight gradients disagreed with finite differences).
    // The hidden state is in the compute type and the cell state in fp32: zeros from one buffer.
    state_md_ = memory::desc({1, 1, N, H}, dt::f32, tag::ldnc);
    h0_md_ = memory::desc({1, 1, N, H}, compute, tag::ldnc);
    fwd_pd_ = dnnl::lstm_forward::primitive_desc(dnnl_engine(), dnnl::prop_kind::forward_training, dir, src_in,
                                                 h0_md_, state_md_, any_wl, any_wi, bias_md_, dst_out, none, none,
                                                 dnnl_scratchpad_attr());
    fwd_ = dnnl::lstm_forward(fwd_pd_);
    // Every gradient is fp32 (in bf16 too: oneDNN's bf16 RNN backward takes no other).
    bwd_pd_ = dnnl::lstm_backward::primitive_desc(
        dnnl_engine(), dnnl::prop_kind::backward, dir, src_in, h0_md_, state_md_, any_wl, any_wi, bias_md_, dst_out,
        none, none, src_md_, state_md_, state_md_, diff_any_wl, diff_any_wi, bias_md_, dst_md_, none, none, fwd_pd_,
        dnnl_scratchpad_attr());
    bwd_ = dnnl::lstm_backward(bwd_pd_);
    const std::string shape = "T" + std::to_string(g.seq_len) + " N" + std::to_string(N) + " I" + std::to_string(I) +
                              " H" + std::to_string(H);
    const std::string bf16 = g.bf16 ? " bf16" : "";
    record_primitive("lstm fwd" + bf16, shape, fwd_pd_.impl_info_str());
    record_primitive("lstm bwd" + bf16, shape, bwd_pd_.impl_info_str());

    x_.prepare(src_md_, src_in);  // copies only in bf16
    y_.prepare(dst_md_, dst_out);
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
    memory src = x_.in(x);
    memory dst = y_.out(y);
    run(fwd_, fwd_pd_.scratchpad_desc(),
        {{DNNL_ARG_SRC_LAYER, src},
         {DNNL_ARG_WEIGHTS_LAYER, fwd_wl_.in(w_ih)},
         {DNNL_ARG_WEIGHTS_ITER, fwd_wi_.in(w_hh)},
         {DNNL_ARG_BIAS, mem(bias_md_, bias_.data())},
         {DNNL_ARG_DST_LAYER, dst},
         {DNNL_ARG_SRC_ITER, mem(h0_md_, zero_state_.data())},
         {DNNL_ARG_SRC_ITER_C, mem(state_md_, zero_state_.data())},
         {DNNL_ARG_WORKSPACE, workspace_}});
    y_.out_done(y);
    forward_x_ = x;
    forward_y_ = y;
  }

  void backward(const float* x, const float* w_ih, const float* w_hh, const float* y, const float* dy, float* dx,
                float* dw_ih, float* dw_hh, float* db_ih, float* db_hh) override {
    std::memset(dbias_.data(), 0, sizeof(float) * 4 * g_.hidden);
    memory dwl = diff_wl_.zeroed_out(dw_ih), dwi = diff_wi_.zeroed_out(dw_hh);
    // The bf16 input and output forward computed with, unless these are other buffers.
    memory src = x_.same() || x != forward_x_ ? x_.in(x) : x_.mem;
    memory dst = y_.same() || y != forward_y_ ? y_.in(y) : y_.mem;
    run(bwd_, bwd_pd_.scratchpad_desc(),
        {{DNNL_ARG_SRC_LAYER, src},
         {DNNL_ARG_WEIGHTS_LAYER, bwd_wl_.in(w_ih)},
         {DNNL_ARG_WEIGHTS_ITER, bwd_wi_.in(w_hh)},
         {DNNL_ARG_BIAS, mem(bias_md_, bias_.data())},
         {DNNL_ARG_DST_LAYER, dst},
         {DNNL_ARG_DIFF_DST_LAYER, mem(dst_md_, dy)},
         {DNNL_ARG_WORKSPACE, workspace_},
         {DNNL_ARG_DIFF_SRC_LAYER, mem(src_md_, dx)},
         {DNNL_ARG_DIFF_WEIGHTS_LAYER, dwl},
         {DNNL_ARG_DIFF_WEIGHTS_ITER, dwi},
         {DNNL_ARG_SRC_ITER, mem(h0_md_, zero_state_.data())},
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
  memory::desc src_md_, dst_md_, bias_md_, state_md_, h0_md_;  // src, dst: the user's fp32 tensors
  dnnl::lstm_forward::primitive_desc fwd_pd_;
  dnnl::lstm_forward fwd_;
  dnnl::lstm_backward::primitive_desc bwd_pd_;
  dnnl::lstm_backward bwd_;
  Staged x_, y_;  // the bf16 input and output (no copies in fp32)
  Staged fwd_wl_, fwd_wi_, bwd_wl_, bwd_wi_, diff_wl_, diff_wi_;
  HostBuffer workspace_buf_, bias_, dbias_, zero_state_, diff_state_;
  memory workspace_;
  const float* forward_x_ = nullptr;  // the last forward's input and output, whose bf16 copies x_, y_ hold
  const float* forward_y_ = nullptr;
};

}  // namespace

std::unique_ptr<LstmDirectionOp> make_dnnl_lstm(const LstmDirectionGeometry& g) { return std::make_unique<DnnlLstm>(g); }

}  // namespace trainer::models::cpu
