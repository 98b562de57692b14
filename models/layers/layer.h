// The layer contract (Caffe/llm.c style): a layer owns its forward and its hand-written backward.
//
// - forward(x) computes the output into a buffer the layer owns and returns it; the layer may keep
//   a pointer to x, which must stay valid until backward (the previous layer owns it).
// - backward(dy) takes the gradient of the output, WRITES (not adds) the gradients of the
//   parameters the layer owns into the model's flat gradient buffer, and returns dx in a buffer the
//   layer owns. Parameters are never shared between layers, so there is nothing to accumulate and
//   no zeroing pass over the gradient buffer.
// - Parameters and non-trainable state (batch-norm running statistics) are declared in the
//   constructor into the model's stores under PyTorch's state_dict names.
#pragma once

#include <random>
#include <string>

#include "models/backend.h"
#include "models/parameters.h"
#include "models/tensor.h"

namespace trainer::models {

enum class Mode { kTrain, kEval };

// What a layer needs while it is built.
struct LayerContext {
  Backend& backend;
  ParameterStore& params;   // trainable, with gradients
  ParameterStore& buffers;  // non-trainable state saved with the model
};

using Rng = std::mt19937_64;

class Layer {
 public:
  virtual ~Layer() = default;
  virtual const Tensor& forward(const Tensor& x, Mode mode) = 0;
  virtual const Tensor& backward(const Tensor& dy) = 0;
  // Sets initial parameter values (stores are allocated by then). Draws from rng in a fixed order.
  virtual void init(Rng& rng) {}
  // Multiply-add work of the last forward, in FLOPs (2 per multiply-add); the convolution and
  // GEMM layers report it, everything else is memory-bound and counts 0. Backward is about twice.
  virtual double forward_flops() const { return 0; }
};

// Keeps the last few ops made for a layer, keyed by geometry: training and evaluation alternate
// between two batch sizes (and a last partial batch), and rebuilding primitives each time would
// cost more than the step.
template <class Geometry, class Op>
class OpCache {
 public:
  template <class Make>
  Op& get(const Geometry& g, Make&& make) {
    for (auto& [geometry, op] : entries_)
      if (geometry == g) return *op;
    if (entries_.size() == kMax) entries_.erase(entries_.begin());
    entries_.emplace_back(g, make(g));
    return *entries_.back().second;
  }

 private:
  static constexpr size_t kMax = 4;
  std::vector<std::pair<Geometry, std::unique_ptr<Op>>> entries_;
};

}  // namespace trainer::models
