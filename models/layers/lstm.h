#pragma once

#include <memory>
#include <vector>

#include "models/layers/sequence.h"
#include "models/streamed_weights.h"

namespace trainer::models {

struct LstmOptions {
  int64_t input_size = 0, hidden_size = 0, num_layers = 1;
  bool bidirectional = false;
};

// torch.nn.LSTM (time-major, zero initial state, no dropout) over a padded batch with lengths,
// computing what PyTorch computes on the packed sequence: x {T, N, input} -> y {T, N, D*hidden}
// (D = 2 when bidirectional: the forward direction's features, then the reverse direction's).
// Outputs past a sequence's length are zero and its reverse direction starts at its own last step;
// padding rows of x do not affect the result. Parameters carry PyTorch's names, shapes and order
// (<name>.weight_ih_l{k}[_reverse] {4H, in}, weight_hh_l{k}[_reverse] {4H, H},
// bias_ih_l{k}[_reverse] {4H}, bias_hh_l{k}[_reverse] {4H}; gates i, f, g, o), so state dicts and
// parameter counts interchange. Initialization as PyTorch: everything U(-1/sqrt(H), 1/sqrt(H)).
// The whole stack is one backend op (LstmOp, backend.h), one per input shape.
class Lstm final : public SequenceLayer {
 public:
  Lstm(LayerContext ctx, const std::string& name, const LstmOptions& options);
  const Tensor& forward(const Tensor& x, Mode mode) override;
  const Tensor& backward(const Tensor& dy) override;
  void init(Rng& rng) override;
  double forward_flops() const override { return flops_; }
  // Each layer and direction of the last forward: its recurrent weights W_hh, read at every time
  // step by forward (h_{t-1} W_hh^T) and by backward (dgates_t W_hh); the input products run over
  // all steps at once and are not streamed.
  std::vector<StreamedWeights> streamed_weights() const;

 private:
  // The parameter ids of one (layer, direction).
  struct Direction {
    int w_ih = -1, w_hh = -1, b_ih = -1, b_hh = -1;
  };
  int64_t directions() const { return opt_.bidirectional ? 2 : 1; }
  // The op's view of the parameters and gradients (pointers into the flat buffers).
  const LstmWeights& weights();
  const LstmGradients& gradients();

  LayerContext ctx_;
  LstmOptions opt_;
  double flops_ = 0;
  int64_t steps_ = 0, batch_ = 0;  // of the last forward
  std::vector<Direction> dirs_;  // layer-major: dirs_[layer * directions() + d]
  std::unique_ptr<LstmOp> op_;  // made at the first forward
  LstmWeights weights_;
  LstmGradients grads_;
  OwnedTensor y_{ctx_.backend}, dx_{ctx_.backend};
  Tensor x_;  // a copy of the input view
  const int32_t* lengths_ = nullptr;
};

}  // namespace trainer::models
