#include "models/layers/lstm.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {

Lstm::Lstm(LayerContext ctx, const std::string& name, const LstmOptions& options) : ctx_(ctx), opt_(options) {
  if (opt_.input_size <= 0 || opt_.hidden_size <= 0 || opt_.num_layers <= 0)
    throw std::invalid_argument("Lstm " + name + ": sizes and layer count must be positive");
  const int64_t H = opt_.hidden_size;
  dirs_.resize(opt_.num_layers * directions());
  for (int64_t k = 0; k < opt_.num_layers; ++k) {
    const int64_t in = k == 0 ? opt_.input_size : directions() * H;
    for (int64_t d = 0; d < directions(); ++d) {
      Direction& dir = dirs_[k * directions() + d];
      const std::string suffix = "_l" + std::to_string(k) + (d == 1 ? "_reverse" : "");
      dir.w_ih = ctx.params.declare(name + ".weight_ih" + suffix, {4 * H, in});
      dir.w_hh = ctx.params.declare(name + ".weight_hh" + suffix, {4 * H, H});
      dir.b_ih = ctx.params.declare(name + ".bias_ih" + suffix, {4 * H});
      dir.b_hh = ctx.params.declare(name + ".bias_hh" + suffix, {4 * H});
    }
  }
}

void Lstm::init(Rng& rng) {
  const float bound = 1.f / std::sqrt(static_cast<float>(opt_.hidden_size));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  for (Direction& dir : dirs_)
    for (int id : {dir.w_ih, dir.w_hh, dir.b_ih, dir.b_hh}) {
      Tensor t = ctx_.params.initial_value(id);
      for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = uniform(rng);
    }
}

namespace {

// The four tensors of every (layer, direction) into `set` (LstmWeights or LstmGradients), each as
// `tensor(parameter id)` gives it: a value or a gradient.
template <class Set, class Directions, class TensorOf>
const Set& collect(Set& set, const Directions& dirs, TensorOf tensor) {
  set = {};
  for (const auto& dir : dirs) {
    set.w_ih.push_back(tensor(dir.w_ih).data);
    set.w_hh.push_back(tensor(dir.w_hh).data);
    set.b_ih.push_back(tensor(dir.b_ih).data);
    set.b_hh.push_back(tensor(dir.b_hh).data);
  }
  return set;
}

}  // namespace

const LstmWeights& Lstm::weights() {
  return collect(weights_, dirs_, [this](int id) { return ctx_.params.value(id); });
}

const LstmGradients& Lstm::gradients() {
  return collect(grads_, dirs_, [this](int id) { return ctx_.params.grad(id); });
}

const Tensor& Lstm::forward(const Tensor& x, Mode mode) {
  if (x.rank() != 3 || x.dim(2) != opt_.input_size)
    throw std::invalid_argument("Lstm: expected input {T, N, " + std::to_string(opt_.input_size) + "}, got " +
                                shape_string(x.shape));
  lengths_ = lengths_for(x, "Lstm");
  x_ = x;
  const int64_t T = x.dim(0), N = x.dim(1), H = opt_.hidden_size, D = directions();
  const LstmGeometry g{opt_.input_size, H, opt_.num_layers, opt_.bidirectional};
  if (!op_) op_ = ctx_.backend.make_lstm(g);  // one op for every batch shape
  Tensor& y = y_.resize({T, N, D * H});
  op_->forward(T, N, x.data, lengths_, weights(), y.data, mode == Mode::kTrain);
  flops_ = 0;
  steps_ = T, batch_ = N;
  for (int64_t k = 0; k < opt_.num_layers; ++k)
    for (int64_t d = 0; d < D; ++d) flops_ += 2.0 * T * N * 4 * H * (g.layer_input(k) + H);
  return y;
}

std::vector<StreamedWeights> Lstm::streamed_weights() const {
  const int64_t H = opt_.hidden_size;
  const StreamedWeights w_hh{4 * H * H, 2.0 * steps_ * 4 * H * H, batch_};
  return std::vector<StreamedWeights>(opt_.num_layers * directions(), w_hh);
}

const Tensor& Lstm::backward(const Tensor& dy) {
  if (!op_) throw std::logic_error("Lstm: backward before forward");
  Tensor& dx = dx_.resize(x_.shape);
  op_->backward(x_.dim(0), x_.dim(1), x_.data, lengths_, weights(), y_.view().data, dy.data, dx.data, gradients());
  return dx;
}

}  // namespace trainer::models
