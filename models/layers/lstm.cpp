#include "models/layers/lstm.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {

Lstm::Lstm(LayerContext ctx, const std::string& name, const LstmOptions& options) : ctx_(ctx), opt_(options) {
  if (opt_.input_size <= 0 || opt_.hidden_size <= 0 || opt_.num_layers <= 0)
    throw std::invalid_argument("Lstm " + name + ": sizes and layer count must be positive");
  const int64_t H = opt_.hidden_size;
  dirs_.reserve(opt_.num_layers * directions());
  for (int64_t i = 0; i < opt_.num_layers * directions(); ++i) dirs_.emplace_back(ctx.backend);
  for (int64_t k = 0; k < opt_.num_layers; ++k) {
    const int64_t in = k == 0 ? opt_.input_size : directions() * H;
    for (int64_t d = 0; d < directions(); ++d) {
      Direction& dir = dirs_[k * directions() + d];
      const std::string suffix = "_l" + std::to_string(k) + (d == 1 ? "_reverse" : "");
      dir.reverse = d == 1;
      dir.w_ih = ctx.params.declare(name + ".weight_ih" + suffix, {4 * H, in});
      dir.w_hh = ctx.params.declare(name + ".weight_hh" + suffix, {4 * H, H});
      dir.b_ih = ctx.params.declare(name + ".bias_ih" + suffix, {4 * H});
      dir.b_hh = ctx.params.declare(name + ".bias_hh" + suffix, {4 * H});
    }
  }
  resize_owned(outputs_, opt_.num_layers, ctx.backend);
  resize_owned(grads_, opt_.num_layers, ctx.backend);
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

const Tensor& Lstm::forward(const Tensor& x, Mode mode) {
  if (x.rank() != 3 || x.dim(2) != opt_.input_size)
    throw std::invalid_argument("Lstm: expected input {T, N, " + std::to_string(opt_.input_size) + "}, got " +
                                shape_string(x.shape));
  lengths_ = lengths_for(x, "Lstm");
  x_ = x;
  Backend& be = ctx_.backend;
  const int64_t T = x.dim(0), N = x.dim(1), H = opt_.hidden_size, D = directions();
  flops_ = 0;
  const Tensor* in = &x;
  for (int64_t k = 0; k < opt_.num_layers; ++k) {
    const int64_t I = in->dim(2);
    Tensor& out = outputs_[k].resize({T, N, D * H});
    for (int64_t d = 0; d < D; ++d) {
      Direction& dir = dirs_[k * D + d];
      const LstmGeometry g{T, N, I, H};
      dir.op = &dir.ops.get(g, [&](const LstmGeometry& geometry) { return be.make_lstm(geometry); });
      const float* src = in->data;
      if (dir.reverse) {
        float* reversed = dir.x_reversed.resize({T, N, I}).data;
        be.sequence_gather(T, N, I, lengths_, true, in->data, I, reversed, I);
        src = reversed;
      }
      Tensor& y = dir.y.resize({T, N, H});
      dir.op->forward(src, ctx_.params.value(dir.w_ih).data, ctx_.params.value(dir.w_hh).data,
                      ctx_.params.value(dir.b_ih).data, ctx_.params.value(dir.b_hh).data, y.data,
                      mode == Mode::kTrain);
      // Steps past a sequence's length ran on padding; they are dropped here (and reversed back).
      be.sequence_gather(T, N, H, lengths_, dir.reverse, y.data, H, out.data + d * H, D * H);
      flops_ += 2.0 * T * N * 4 * H * (I + H);
    }
    in = &out;
  }
  return outputs_.back().view();
}

const Tensor& Lstm::backward(const Tensor& dy) {
  Backend& be = ctx_.backend;
  const int64_t T = x_.dim(0), N = x_.dim(1), H = opt_.hidden_size, D = directions();
  const Tensor* grad_out = &dy;
  for (int64_t k = opt_.num_layers - 1; k >= 0; --k) {
    const Tensor& in = k == 0 ? x_ : outputs_[k - 1].view();
    const int64_t I = in.dim(2);
    Tensor& grad_in = grads_[k].resize({T, N, I});
    for (int64_t d = 0; d < D; ++d) {
      Direction& dir = dirs_[k * D + d];
      // The op's output gradient: this direction's features, zero on padding, in the op's time order.
      float* dy_dir = dir.dy.resize({T, N, H}).data;
      be.sequence_gather(T, N, H, lengths_, dir.reverse, grad_out->data + d * H, D * H, dy_dir, H);
      const float* src = dir.reverse ? dir.x_reversed.view().data : in.data;
      float* dx = dir.reverse ? dir.dx.resize({T, N, I}).data : grad_in.data;
      dir.op->backward(src, ctx_.params.value(dir.w_ih).data, ctx_.params.value(dir.w_hh).data, dir.y.view().data,
                       dy_dir, dx, ctx_.params.grad(dir.w_ih).data, ctx_.params.grad(dir.w_hh).data,
                       ctx_.params.grad(dir.b_ih).data, ctx_.params.grad(dir.b_hh).data);
      if (dir.reverse) {
        float* back = reversed_grad_.resize({T, N, I}).data;
        be.sequence_gather(T, N, I, lengths_, true, dx, I, back, I);
        be.add(T * N * I, grad_in.data, back, grad_in.data);
      }
    }
    grad_out = &grad_in;
  }
  return grads_[0].view();
}

}  // namespace trainer::models
