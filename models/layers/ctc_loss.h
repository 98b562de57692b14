#pragma once

#include <cstdint>
#include <vector>

#include "models/backend.h"

namespace trainer::models {

// Connectionist temporal classification loss (Graves et al. 2006), blank = class 0, on
// unnormalized logits {T, N, classes} (a log-softmax over classes is part of the loss).
//
// The value is the mean over the batch of the per-utterance negative log-likelihoods, which is
// torch.nn.functional.ctc_loss(logits.log_softmax(2), ..., reduction='sum') / N. It is not
// PyTorch's reduction='mean', which first divides each utterance's loss by its label count.
// Utterance n uses its first frames[n] frames; labels holds all utterances' ids back to back,
// label_lengths[n] each (no blanks among them). An utterance whose labels do not fit in its frames
// has an infinite loss (so the mean is infinite) and contributes no gradient.
class CtcLoss {
 public:
  explicit CtcLoss(Backend& backend) : backend_(backend) {}
  // Returns the mean loss; with want_grad, keeps d(mean loss)/d logits for backward().
  double forward(const Tensor& logits, const int32_t* frames, const int32_t* labels, const int32_t* label_lengths,
                 bool want_grad);
  // The gradient of the last forward's mean loss with respect to its logits (zero on padding).
  const Tensor& backward() const { return dlogits_.view(); }
  // Per-utterance losses of the last forward.
  const std::vector<double>& losses() const { return losses_; }

 private:
  Backend& backend_;
  std::vector<double> losses_;
  OwnedTensor dlogits_{backend_};
};

// Greedy (best-path) CTC decoding of host logits {T, N, classes}: per frame the argmax class, over
// the first frames[n] frames; repeats collapsed, then blanks dropped.
std::vector<std::vector<int32_t>> ctc_greedy_decode(const Tensor& logits, const int32_t* frames);

}  // namespace trainer::models
