// The CPU backend's whole LSTM (LstmOp, backend.h): a loop over layers and directions around one
// direction op each (lstm_ops.h: oneDNN or GEMMs), which runs left to right over full-length
// sequences from a zero state. The loop masks and reverses around them with sequence_gather: the
// reverse direction gets each sequence reversed within its own length (so its first step is the
// sequence's last valid one), and each direction's output is gathered (and reversed) back into the
// layer's D*H features with the steps past each length zeroed. The forward direction also runs over
// the padding steps after each sequence's end; their outputs are dropped, and in backward their
// gate gradients are exactly zero (zero output gradient, nothing flowing back from later steps), so
// finite padding reaches no valid output and no gradient.
//
// This is the loop the Lstm layer ran before the op took whole LSTMs (so cuDNN could take them in
// one call); moved here unchanged, it gives the same bits (checked on fixed-seed DeepSpeech and LAS
// steps with both direction ops). The direction ops (oneDNN primitives) and buffers are per shape
// (T, N): the op keeps the last few shapes' stacks, as the layer's op cache did before the op
// became shape-free.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cpu/lstm_ops.h"
#include "models/cpu/sequence_ops.h"

namespace trainer::models::cpu {
namespace {

// The stack for one shape (T, N).
class ShapedStack {
 public:
  ShapedStack(const LstmGeometry& g, const BackendSettings& settings, int64_t steps, int64_t batch)
      : g_(g), T_(steps), N_(batch) {
    const bool bf16 = settings.precision == Precision::kBf16;
    const int64_t T = steps, N = batch, H = g.hidden, D = g.directions();
    dirs_.resize(g.layers * D);
    for (int64_t k = 0; k < g.layers; ++k) {
      const int64_t I = g.layer_input(k);
      for (int64_t d = 0; d < D; ++d) {
        Direction& dir = dirs_[k * D + d];
        dir.reverse = d == 1;
        dir.op = make_lstm_direction({T, N, I, H, bf16}, settings.lstm_algorithm);
        dir.y.resize(T * N * H);
        dir.dy.resize(T * N * H);
        if (dir.reverse) {
          dir.x_reversed.resize(T * N * I);
          dir.dx.resize(T * N * I);
        }
      }
    }
    // Layer k < L-1 writes outputs_[k] (the last one writes y); layer k > 0 writes its input
    // gradient to grads_[k] (layer 0 writes dx). Every such tensor is {T, N, D*H}.
    outputs_.resize(g.layers - 1);
    grads_.resize(g.layers);
    for (int64_t k = 0; k + 1 < g.layers; ++k) outputs_[k].resize(T * N * D * H);
    for (int64_t k = 1; k < g.layers; ++k) grads_[k].resize(T * N * D * H);
    if (D == 2) reversed_grad_.resize(T * N * std::max(g.input, D * H));
  }

  bool fits(int64_t steps, int64_t batch) const { return steps == T_ && batch == N_; }

  void forward(const float* x, const int32_t* lengths, const LstmWeights& w, float* y, bool training) {
    const int64_t T = T_, N = N_, H = g_.hidden, D = g_.directions();
    const float* in = x;
    for (int64_t k = 0; k < g_.layers; ++k) {
      const int64_t I = g_.layer_input(k);
      float* out = k + 1 == g_.layers ? y : outputs_[k].data();
      for (int64_t d = 0; d < D; ++d) {
        const int64_t i = k * D + d;
        Direction& dir = dirs_[i];
        const float* src = in;
        if (dir.reverse) {
          sequence_gather(T, N, I, lengths, true, in, I, dir.x_reversed.data(), I);
          src = dir.x_reversed.data();
        }
        dir.op->forward(src, w.w_ih[i], w.w_hh[i], w.b_ih[i], w.b_hh[i], dir.y.data(), training);
        // Steps past a sequence's length ran on padding; they are dropped here (and reversed back).
        sequence_gather(T, N, H, lengths, dir.reverse, dir.y.data(), H, out + d * H, D * H);
      }
      in = out;
    }
  }

  void backward(const float* x, const int32_t* lengths, const LstmWeights& w, const float* dy, float* dx,
                const LstmGradients& grads) {
    const int64_t T = T_, N = N_, H = g_.hidden, D = g_.directions();
    const float* grad_out = dy;
    for (int64_t k = g_.layers - 1; k >= 0; --k) {
      const float* in = k == 0 ? x : outputs_[k - 1].data();
      const int64_t I = g_.layer_input(k);
      float* grad_in = k == 0 ? dx : grads_[k].data();
      for (int64_t d = 0; d < D; ++d) {
        const int64_t i = k * D + d;
        Direction& dir = dirs_[i];
        // The direction op's output gradient: its features, zero on padding, in its time order.
        sequence_gather(T, N, H, lengths, dir.reverse, grad_out + d * H, D * H, dir.dy.data(), H);
        const float* src = dir.reverse ? dir.x_reversed.data() : in;
        float* ddx = dir.reverse ? dir.dx.data() : grad_in;
        dir.op->backward(src, w.w_ih[i], w.w_hh[i], dir.y.data(), dir.dy.data(), ddx, grads.w_ih[i], grads.w_hh[i],
                         grads.b_ih[i], grads.b_hh[i]);
        if (dir.reverse) {
          float* back = reversed_grad_.data();
          sequence_gather(T, N, I, lengths, true, ddx, I, back, I);
          const int64_t n = T * N * I;
#pragma omp parallel for simd schedule(static)
          for (int64_t j = 0; j < n; ++j) grad_in[j] = grad_in[j] + back[j];
        }
      }
      grad_out = grad_in;
    }
  }

 private:
  // One direction of one layer: its op and buffers (time reversed for the reverse direction, so the
  // op always runs left to right from each sequence's first valid step).
  struct Direction {
    std::unique_ptr<LstmDirectionOp> op;
    bool reverse = false;
    HostBuffer x_reversed, y, dy, dx;
  };

  LstmGeometry g_;
  int64_t T_ = 0, N_ = 0;
  std::vector<Direction> dirs_;        // layer-major: dirs_[layer * D + d]
  std::vector<HostBuffer> outputs_;    // each layer's output but the last {T, N, D*H}
  std::vector<HostBuffer> grads_;      // each layer's input gradient but the first
  HostBuffer reversed_grad_;
};

class LstmStack final : public LstmOp {
 public:
  LstmStack(const LstmGeometry& g, const BackendSettings& settings) : g_(g), settings_(settings) {
    if (g.input <= 0 || g.hidden <= 0 || g.layers <= 0)
      throw std::invalid_argument("CPU LSTM: sizes and layer count must be positive");
  }

  void forward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w, float* y,
               bool training) override {
    check(w.w_ih.size(), w.w_hh.size(), w.b_ih.size(), w.b_hh.size(), "weights");
    stack(steps, batch).forward(x, lengths, w, y, training);
  }

  void backward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w,
                const float*, const float* dy, float* dx, const LstmGradients& grads) override {
    check(w.w_ih.size(), w.w_hh.size(), w.b_ih.size(), w.b_hh.size(), "weights");
    check(grads.w_ih.size(), grads.w_hh.size(), grads.b_ih.size(), grads.b_hh.size(), "gradients");
    stack(steps, batch).backward(x, lengths, w, dy, dx, grads);
  }

 private:
  // The stack of this shape: kept, or made (an empty batch or T = 0 is allowed, as it was before the
  // op took whole LSTMs), dropping the oldest of kMaxShapes.
  ShapedStack& stack(int64_t steps, int64_t batch) {
    if (steps < 0 || batch < 0) throw std::invalid_argument("CPU LSTM: a negative sequence length or batch");
    for (const auto& s : stacks_)
      if (s->fits(steps, batch)) return *s;
    if (stacks_.size() == kMaxShapes) stacks_.erase(stacks_.begin());
    stacks_.push_back(std::make_unique<ShapedStack>(g_, settings_, steps, batch));
    return *stacks_.back();
  }

  void check(size_t a, size_t b, size_t c, size_t d, const char* what) const {
    const size_t n = static_cast<size_t>(g_.layers * g_.directions());
    if (a != n || b != n || c != n || d != n)
      throw std::invalid_argument(std::string("CPU LSTM: ") + what + " for " + std::to_string(n) +
                                  " (layer, direction) pairs expected");
  }

  static constexpr size_t kMaxShapes = 4;
  LstmGeometry g_;
  BackendSettings settings_;
  std::vector<std::unique_ptr<ShapedStack>> stacks_;
};

}  // namespace

std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g, const BackendSettings& settings) {
  return std::make_unique<LstmStack>(g, settings);
}

}  // namespace trainer::models::cpu
