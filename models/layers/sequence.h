// Layers over batches of sequences. Activations are time-major {T, N, C} (PyTorch's RNN default):
// sequence n has lengths[n] <= T valid steps and the rest of its rows are padding, which these
// layers ignore on input and write as zeros. The lengths of a batch are given before its forward
// (set_lengths); without them every sequence is T steps long.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "models/layers/layer.h"

namespace trainer::models {

class SequenceLayer : public Layer {
 public:
  // The lengths of the batches the next forwards see (empty: full length).
  void set_lengths(std::vector<int32_t> lengths) { given_ = std::move(lengths); }

 protected:
  // The lengths for a forward over x {T, N, ...}, checked against T and N; a copy that stays valid
  // until the next forward (backward uses it), whatever set_lengths is given meanwhile.
  const int32_t* lengths_for(const Tensor& x, const char* layer) {
    const int64_t steps = x.dim(0), batch = x.dim(1);
    if (given_.empty()) {
      current_.assign(batch, static_cast<int32_t>(steps));
      return current_.data();
    }
    if (static_cast<int64_t>(given_.size()) != batch)
      throw std::invalid_argument(std::string(layer) + ": " + std::to_string(given_.size()) +
                                  " lengths for a batch of " + std::to_string(batch));
    for (int32_t length : given_)
      if (length < 0 || length > steps)
        throw std::invalid_argument(std::string(layer) + ": sequence length " + std::to_string(length) +
                                    " outside [0, " + std::to_string(steps) + "]");
    current_ = given_;
    return current_.data();
  }

 private:
  std::vector<int32_t> given_, current_;
};

}  // namespace trainer::models
