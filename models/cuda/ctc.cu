// CTC loss on the GPU (backend.h): the log-space forward-backward recursions of Graves et al.
// (2006), the arithmetic of the CPU's models/cpu/ctc.cpp step for step, in double.
//
// Why not cuDNN's cudnnCTCLoss: it wants every utterance's input length equal to T and labels
// below 256, and AN4's batches are padded to their longest utterance (each has its own frame
// count). PyTorch's CUDA ctc_loss falls back to its own kernels for the same reason.
//
// Two kernels. The first is the log-softmax of every valid frame's logits, in double, into lp
// {T, N, classes} (one thread per (t, n) row: the speech models have tens of classes). The second
// runs one block per utterance: the extended label sequence's 2L + 1 states lie across the block's
// threads (a thread takes states tid, tid + blockDim, ... when there are more), alpha and beta of
// every frame go to device scratch, and the block synchronizes once per frame, since frame t
// reads frame t - 1's states (t + 1's for beta) written by other threads. Then its threads share
// the (frame, class) pairs of the gradient. Each state, each class's occupancy and each loss is
// summed by one thread in the CPU's order, so nothing depends on timing.
#include <cmath>
#include <cstdint>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

constexpr int kCtcThreads = 256;

// The CPU's log_add: -inf with -inf stays -inf (never exp(-inf - -inf) = NaN).
__device__ __forceinline__ double log_add(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  return a > b ? a + log1p(exp(b - a)) : b + log1p(exp(a - b));
}

__global__ void ctc_log_softmax_kernel(int64_t steps, int64_t batch, int64_t classes, const float* logits,
                                       HostInts frames, double* lp) {
  for (int64_t row = first_index(); row < steps * batch; row += grid_stride()) {
    const int64_t t = row / batch, n = row % batch;
    if (t >= frames.v[n]) continue;  // padding: never read
    const float* z = logits + row * classes;
    float zmax_f = z[0];  // std::max_element: the first largest
    for (int64_t k = 1; k < classes; ++k)
      if (zmax_f < z[k]) zmax_f = z[k];
    const double zmax = zmax_f;
    double sum = 0.0;
    for (int64_t k = 0; k < classes; ++k) sum += exp(z[k] - zmax);
    const double log_sum = zmax + log(sum);
    double* out = lp + row * classes;
    for (int64_t k = 0; k < classes; ++k) out[k] = z[k] - log_sum;
  }
}

// Block n: utterance n. alpha and beta hold, one utterance after another, frames[n] * (2L + 1)
// doubles each (the launcher sized them from the same host arrays); beta and dlogits are null
// when no gradient is wanted.
__global__ void ctc_alpha_beta_kernel(int64_t steps, int64_t batch, int64_t classes, const double* lp,
                                      HostInts frames, HostInts label_lengths, const int32_t* labels, float grad_scale,
                                      double* alpha_all, double* beta_all, double* losses, float* dlogits) {
  const int64_t n = blockIdx.x, tid = threadIdx.x, threads = blockDim.x;
  // This utterance's labels and states: everything before it, from the parameters (O(batch)).
  int64_t label_start = 0, state_start = 0;
  for (int64_t m = 0; m < n; ++m) {
    const int64_t frames_m = frames.v[m] < steps ? (frames.v[m] > 0 ? frames.v[m] : 0) : steps;
    label_start += label_lengths.v[m];
    state_start += frames_m * (2 * int64_t(label_lengths.v[m]) + 1);
  }
  const int64_t T = frames.v[n] < steps ? (frames.v[n] > 0 ? frames.v[n] : 0) : steps;
  const int64_t L = label_lengths.v[n], S = 2 * L + 1, C = classes, ld = batch * classes;
  const int32_t* label = labels + label_start;
  float* grad = dlogits ? dlogits + n * classes : nullptr;  // row t at grad + t * ld
  // Frame t's log-probabilities; the extended sequence: blank, l1, blank, l2, ..., blank.
  auto lpt = [=](int64_t t) { return lp + (t * batch + n) * classes; };
  auto ext = [=](int64_t s) -> int64_t { return s % 2 == 0 ? 0 : label[s / 2]; };
  // A transition s-2 -> s skips a blank; allowed into a label that differs from the one before it.
  auto can_skip = [=](int64_t s) { return s >= 2 && s % 2 == 1 && ext(s) != ext(s - 2); };

  // The shortest alignment emits every label once and one blank between equal neighbours. Every
  // thread counts (the same answer), so the early return below is taken by the whole block.
  int64_t needed = L;
  for (int64_t i = 1; i < L; ++i) needed += label[i] == label[i - 1];
  if (T < needed || T == 0) {
    if (tid == 0) losses[n] = INFINITY;
    if (grad)
      for (int64_t i = tid; i < steps * C; i += threads) grad[(i / C) * ld + i % C] = 0.f;
    return;
  }

  double* alpha = alpha_all + state_start;  // alpha[t * S + s]
  for (int64_t s = tid; s < S; s += threads) alpha[s] = s == 0 ? lpt(0)[0] : s == 1 ? lpt(0)[ext(1)] : -INFINITY;
  __syncthreads();
  for (int64_t t = 1; t < T; ++t) {
    const double* prev = alpha + (t - 1) * S;
    double* cur = alpha + t * S;
    const double* y = lpt(t);
    for (int64_t s = tid; s < S; s += threads) {
      double a = prev[s];
      if (s >= 1) a = log_add(a, prev[s - 1]);
      if (can_skip(s)) a = log_add(a, prev[s - 2]);
      cur[s] = a == -INFINITY ? -INFINITY : a + y[ext(s)];
    }
    __syncthreads();  // frame t complete before t + 1 reads it
  }
  const double* last = alpha + (T - 1) * S;
  const double log_p = S > 1 ? log_add(last[S - 1], last[S - 2]) : last[S - 1];
  if (tid == 0) losses[n] = -log_p;
  if (!grad) return;

  double* beta = beta_all + state_start;
  {
    double* cur = beta + (T - 1) * S;
    const double* y = lpt(T - 1);
    for (int64_t s = tid; s < S; s += threads) cur[s] = s == S - 1 || s == S - 2 ? y[ext(s)] : -INFINITY;
  }
  __syncthreads();
  for (int64_t t = T - 2; t >= 0; --t) {
    const double* next = beta + (t + 1) * S;
    double* cur = beta + t * S;
    const double* y = lpt(t);
    for (int64_t s = tid; s < S; s += threads) {
      double b = next[s];
      if (s + 1 < S) b = log_add(b, next[s + 1]);
      if (s + 2 < S && can_skip(s + 2)) b = log_add(b, next[s + 2]);
      cur[s] = b == -INFINITY ? -INFINITY : b + y[ext(s)];
    }
    __syncthreads();
  }

  // d(-log p)/d z_k = softmax_k - sum_{s: ext(s) = k} alpha_t(s) beta_t(s) / (p * y_k): alpha and
  // beta both include frame t's emission, hence the division by y_k. One thread per (t, k) sums
  // its class's states in increasing s, the CPU's order (a label k > 0 sits only at odd states).
  for (int64_t i = tid; i < T * C; i += threads) {
    const int64_t t = i / C, k = i % C;
    const double* a = alpha + t * S;
    const double* b = beta + t * S;
    double occupancy = -INFINITY;
    if (k == 0) {  // every even state, and any label that is the blank itself (the layer forbids it)
      for (int64_t s = 0; s < S; ++s)
        if (ext(s) == 0) occupancy = log_add(occupancy, a[s] + b[s]);
    } else {
      for (int64_t j = 0; j < L; ++j)
        if (label[j] == k) occupancy = log_add(occupancy, a[2 * j + 1] + b[2 * j + 1]);
    }
    const double y = lpt(t)[k];
    const double g = exp(y) - (occupancy == -INFINITY ? 0.0 : exp(occupancy - log_p - y));
    grad[t * ld + k] = static_cast<float>(grad_scale * g);
  }
  for (int64_t i = tid; i < (steps - T) * C; i += threads) grad[(T + i / C) * ld + i % C] = 0.f;
}

}  // namespace

int64_t ctc_states(int64_t steps, int64_t batch, const HostInts& frames, const HostInts& label_lengths) {
  int64_t states = 0;
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t T = frames.v[n] < steps ? (frames.v[n] > 0 ? frames.v[n] : 0) : steps;
    states += T * (2 * int64_t(label_lengths.v[n]) + 1);
  }
  return states;
}

cudaError_t launch_ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const HostInts& frames,
                            const int32_t* labels, const HostInts& label_lengths, float grad_scale, double* lp,
                            double* alpha, double* beta, double* losses, float* dlogits, cudaStream_t stream) {
  if (batch <= 0) return cudaSuccess;
  if (steps > 0 && classes > 0) {
    ctc_log_softmax_kernel<<<grid_for(steps * batch), kThreads, 0, stream>>>(steps, batch, classes, logits, frames,
                                                                              lp);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  ctc_alpha_beta_kernel<<<static_cast<unsigned>(batch), kCtcThreads, 0, stream>>>(
      steps, batch, classes, lp, frames, label_lengths, labels, grad_scale, alpha, dlogits ? beta : nullptr, losses,
      dlogits);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
