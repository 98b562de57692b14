// CTC loss on the CPU: the log-space forward-backward recursions of Graves et al. (2006), one
// utterance per thread. Utterances are short (hundreds of frames, tens of labels), so everything
// runs in double precision, which keeps long products of probabilities exact enough to compare
// against PyTorch's float64 result.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "models/cpu/sequence_ops.h"

namespace trainer::models::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

inline double log_add(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  return a > b ? a + std::log1p(std::exp(b - a)) : b + std::log1p(std::exp(a - b));
}

// One utterance: T frames of log-probabilities lp {T, C} (row stride C) and its labels. Returns
// -log p(labels) and writes d(-log p)/d logits into grad {T, C} when non-null (row stride
// grad_ld, scaled by `scale`).
double ctc_one(int64_t T, int64_t C, const double* lp, const int32_t* labels, int64_t L, float scale,
               float* grad, int64_t grad_ld) {
  // Extended label sequence: blank, l1, blank, l2, ..., blank (S = 2L + 1 states).
  const int64_t S = 2 * L + 1;
  auto ext = [&](int64_t s) { return s % 2 == 0 ? 0 : labels[s / 2]; };
  // The shortest alignment emits every label once and one blank between equal neighbours.
  int64_t needed = L;
  for (int64_t i = 1; i < L; ++i) needed += labels[i] == labels[i - 1];
  if (T < needed || T == 0) {
    if (grad)
      for (int64_t t = 0; t < T; ++t) std::fill(grad + t * grad_ld, grad + t * grad_ld + C, 0.f);
    return std::numeric_limits<double>::infinity();
  }
  // A transition s-2 -> s skips a blank; allowed into a label that differs from the one before it.
  auto can_skip = [&](int64_t s) { return s >= 2 && s % 2 == 1 && ext(s) != ext(s - 2); };

  std::vector<double> alpha(T * S, kNegInf), beta(T * S, kNegInf);
  alpha[0] = lp[0];
  if (S > 1) alpha[1] = lp[ext(1)];
  for (int64_t t = 1; t < T; ++t) {
    const double* prev = &alpha[(t - 1) * S];
    double* cur = &alpha[t * S];
    // States that cannot reach the end in the frames left stay at -inf; the recursion handles it.
    for (int64_t s = 0; s < S; ++s) {
      double a = prev[s];
      if (s >= 1) a = log_add(a, prev[s - 1]);
      if (can_skip(s)) a = log_add(a, prev[s - 2]);
      cur[s] = a == kNegInf ? kNegInf : a + lp[t * C + ext(s)];
    }
  }
  const double* last = &alpha[(T - 1) * S];
  const double log_p = S > 1 ? log_add(last[S - 1], last[S - 2]) : last[S - 1];
  if (!grad) return -log_p;

  beta[(T - 1) * S + S - 1] = lp[(T - 1) * C + ext(S - 1)];
  if (S > 1) beta[(T - 1) * S + S - 2] = lp[(T - 1) * C + ext(S - 2)];
  for (int64_t t = T - 2; t >= 0; --t) {
    const double* next = &beta[(t + 1) * S];
    double* cur = &beta[t * S];
    for (int64_t s = 0; s < S; ++s) {
      double b = next[s];
      if (s + 1 < S) b = log_add(b, next[s + 1]);
      if (s + 2 < S && can_skip(s + 2)) b = log_add(b, next[s + 2]);
      cur[s] = b == kNegInf ? kNegInf : b + lp[t * C + ext(s)];
    }
  }
  // d(-log p)/d z_k = softmax_k - sum_{s: ext(s) = k} alpha_t(s) beta_t(s) / (p * y_k): alpha and
  // beta both include frame t's emission, hence the division by y_k.
  std::vector<double> occupancy(C);
  for (int64_t t = 0; t < T; ++t) {
    std::fill(occupancy.begin(), occupancy.end(), kNegInf);
    for (int64_t s = 0; s < S; ++s)
      occupancy[ext(s)] = log_add(occupancy[ext(s)], alpha[t * S + s] + beta[t * S + s]);
    for (int64_t k = 0; k < C; ++k) {
      const double y = lp[t * C + k];
      const double g = std::exp(y) - (occupancy[k] == kNegInf ? 0.0 : std::exp(occupancy[k] - log_p - y));
      grad[t * grad_ld + k] = static_cast<float>(scale * g);
    }
  }
  return -log_p;
}

}  // namespace

void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
              const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
              float* dlogits) {
  std::vector<int64_t> label_start(batch + 1, 0);
  for (int64_t n = 0; n < batch; ++n) label_start[n + 1] = label_start[n] + label_lengths[n];
  // One utterance costs T*S exponentials or so: worth a thread only for real batches.
#pragma omp parallel for schedule(dynamic) if(steps * batch * classes >= (1 << 14))
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t T = std::min<int64_t>(frames[n], steps), C = classes;
    // Log-softmax of this utterance's frames, in double.
    std::vector<double> lp(T * C);
    for (int64_t t = 0; t < T; ++t) {
      const float* z = logits + (t * batch + n) * C;
      const double zmax = *std::max_element(z, z + C);
      double sum = 0.0;
      for (int64_t k = 0; k < C; ++k) sum += std::exp(z[k] - zmax);
      const double log_sum = zmax + std::log(sum);
      for (int64_t k = 0; k < C; ++k) lp[t * C + k] = z[k] - log_sum;
    }
    float* grad = dlogits ? dlogits + n * C : nullptr;
    losses[n] = ctc_one(T, C, lp.data(), labels + label_start[n], label_lengths[n], grad_scale, grad, batch * C);
    if (grad)
      for (int64_t t = T; t < steps; ++t) std::fill(grad + t * batch * C, grad + t * batch * C + C, 0.f);
  }
}

}  // namespace trainer::models::cpu
