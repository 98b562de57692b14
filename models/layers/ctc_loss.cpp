#include "models/layers/ctc_loss.h"

#include <algorithm>
#include <stdexcept>

namespace trainer::models {

double CtcLoss::forward(const Tensor& logits, const int32_t* frames, const int32_t* labels,
                        const int32_t* label_lengths, bool want_grad) {
  if (logits.rank() != 3) throw std::invalid_argument("CtcLoss: expected logits {T, N, classes}, got " +
                                                      shape_string(logits.shape));
  const int64_t T = logits.dim(0), N = logits.dim(1), classes = logits.dim(2);
  for (int64_t n = 0; n < N; ++n) {
    if (frames[n] < 1 || frames[n] > T)
      throw std::invalid_argument("CtcLoss: utterance " + std::to_string(n) + " has " + std::to_string(frames[n]) +
                                  " frames, outside [1, " + std::to_string(T) + "]");
    if (label_lengths[n] < 0) throw std::invalid_argument("CtcLoss: negative label length");
  }
  int64_t total_labels = 0;
  for (int64_t n = 0; n < N; ++n) total_labels += label_lengths[n];
  for (int64_t i = 0; i < total_labels; ++i)
    if (labels[i] < 1 || labels[i] >= classes)
      throw std::invalid_argument("CtcLoss: label " + std::to_string(labels[i]) + " outside [1, " +
                                  std::to_string(classes - 1) + "] (0 is the blank)");
  losses_.assign(N, 0.0);
  float* dlogits = want_grad ? dlogits_.resize(logits.shape).data : nullptr;
  backend_.ctc_loss(T, N, classes, logits.data, frames, labels, label_lengths, 1.f / static_cast<float>(N),
                    losses_.data(), dlogits);
  double sum = 0.0;
  for (double loss : losses_) sum += loss;
  return sum / static_cast<double>(N);
}

std::vector<std::vector<int32_t>> ctc_greedy_decode(const Tensor& logits, const int32_t* frames) {
  const int64_t T = logits.dim(0), N = logits.dim(1), C = logits.dim(2);
  std::vector<std::vector<int32_t>> out(N);
  for (int64_t n = 0; n < N; ++n) {
    int32_t previous = 0;
    for (int64_t t = 0; t < std::min<int64_t>(frames[n], T); ++t) {
      const float* z = logits.data + (t * N + n) * C;
      const auto best = static_cast<int32_t>(std::max_element(z, z + C) - z);
      if (best != 0 && best != previous) out[n].push_back(best);
      previous = best;
    }
  }
  return out;
}

}  // namespace trainer::models
