// The GEMM-based LSTM (see lstm_ops.h): PyTorch's cell written as OpenBLAS GEMMs plus one fused
// element-wise loop per time step.
//
// Forward: G = x W_ih^T + (b_ih + b_hh) for all steps at once ({T*N, 4H}); then per step
// G_t += h_{t-1} W_hh^T and the gates: i, f, o = sigmoid, g = tanh, c_t = f c_{t-1} + i g,
// h_t = o tanh(c_t). The activated gates and c_t stay for backward.
// Backward: per step, from dh = dy_t + dG_{t+1} W_hh and the carried dc, the gate gradients dG_t;
// then dW_ih = dG^T x, dW_hh = dG_{1..T-1}^T h_{0..T-2}, db = column sums of dG and dx = dG W_ih,
// each one GEMM over all steps.
// Under runtime.precision = bf16 every product reads bf16 copies of its operands and accumulates in
// fp32 (dnnl_matmul.h); the per-step products keep one copy of W_hh per forward (for the forward's
// product and for backward's), so that each time step streams 2 bytes per weight instead of 4. The
// gates, cell states and every gradient stay fp32.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "models/cpu/dnnl_matmul.h"
#include "models/cpu/lstm_ops.h"

namespace trainer::models::cpu {
namespace {

// Below this many floats a loop runs on one thread: starting a parallel region costs more than
// the work (per step, the gate loop touches 4*N*H floats).
constexpr int64_t kParallelMin = 1 << 13;

// exp on floats in a form the compiler vectorizes (std::exp does not vectorize without
// -ffast-math): Cephes' expf polynomial after range reduction by ln 2, about 1 ulp.
inline float vexp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline float vsigmoid(float x) { return 1.f / (1.f + vexp(-x)); }
// 1 - 2 / (e^{2x} + 1): absolute error about 1e-7 (relative error grows only where |tanh| < 1e-3).
inline float vtanh(float x) { return 1.f - 2.f / (vexp(2.f * x) + 1.f); }

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

class GemmLstm final : public LstmDirectionOp {
 public:
  explicit GemmLstm(const LstmDirectionGeometry& g) : g_(g) {
    const int64_t T = g.seq_len, N = g.batch, H = g.hidden;
    gates_.resize(T * N * 4 * H);
    cells_.resize(T * N * H);
    dgates_.resize(T * N * 4 * H);
    dh_.resize(N * H);
    dc_.resize(N * H);
  }

  void forward(const float* x, const float* w_ih, const float* w_hh, const float* b_ih, const float* b_hh,
               float* y, bool) override {
    const int64_t T = g_.seq_len, N = g_.batch, I = g_.input, H = g_.hidden, G = 4 * H;
    if (g_.bf16) bf16_weights_changed();  // W_hh's copies are made again at this forward's first step
    float* gates = gates_.data();
    std::vector<float> bias(G);
    for (int64_t j = 0; j < G; ++j) bias[j] = b_ih[j] + b_hh[j];
#pragma omp parallel for schedule(static) if(T * N * G >= kParallelMin)
    for (int64_t r = 0; r < T * N; ++r) std::memcpy(gates + r * G, bias.data(), sizeof(float) * G);
    product(false, true, T * N, G, I, x, I, w_ih, I, 1.f, gates, G);
    for (int64_t t = 0; t < T; ++t) {
      float* gt = gates + t * N * G;
      if (t > 0) product(false, true, N, G, H, y + (t - 1) * N * H, H, w_hh, H, 1.f, gt, G, true);
      const float* c_prev = t > 0 ? cells_.data() + (t - 1) * N * H : nullptr;
      float* c = cells_.data() + t * N * H;
      float* h = y + t * N * H;
#pragma omp parallel for schedule(static) if(N * G >= kParallelMin)
      for (int64_t n = 0; n < N; ++n) {
        float* gn = gt + n * G;
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) {
          const float i = vsigmoid(gn[j]), f = vsigmoid(gn[H + j]), gg = vtanh(gn[2 * H + j]),
                      o = vsigmoid(gn[3 * H + j]);
          const float cell = (c_prev ? f * c_prev[n * H + j] : 0.f) + i * gg;
          gn[j] = i;
          gn[H + j] = f;
          gn[2 * H + j] = gg;
          gn[3 * H + j] = o;
          c[n * H + j] = cell;
          h[n * H + j] = o * vtanh(cell);
        }
      }
    }
  }

  void backward(const float* x, const float* w_ih, const float* w_hh, const float* y, const float* dy, float* dx,
                float* dw_ih, float* dw_hh, float* db_ih, float* db_hh) override {
    const int64_t T = g_.seq_len, N = g_.batch, I = g_.input, H = g_.hidden, G = 4 * H;
    float* dgates = dgates_.data();
    float* dh = dh_.data();  // dG_{t+1} W_hh: the gradient reaching h_t through the recurrence
    float* dc = dc_.data();  // the gradient reaching c_t through c_{t+1} = f c_t + ...
    std::fill(dh, dh + N * H, 0.f);
    std::fill(dc, dc + N * H, 0.f);
    for (int64_t t = T - 1; t >= 0; --t) {
      const float* gt = gates_.data() + t * N * G;
      const float* c = cells_.data() + t * N * H;
      const float* c_prev = t > 0 ? cells_.data() + (t - 1) * N * H : nullptr;
      const float* dyt = dy + t * N * H;
      float* dgt = dgates + t * N * G;
#pragma omp parallel for schedule(static) if(N * G >= kParallelMin)
      for (int64_t n = 0; n < N; ++n) {
        const float* gn = gt + n * G;
        float* dgn = dgt + n * G;
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) {
          const int64_t k = n * H + j;
          const float i = gn[j], f = gn[H + j], gg = gn[2 * H + j], o = gn[3 * H + j];
          const float tc = vtanh(c[k]);
          const float dht = dyt[k] + dh[k];
          const float dct = dht * o * (1.f - tc * tc) + dc[k];
          dgn[j] = dct * gg * i * (1.f - i);
          dgn[H + j] = c_prev ? dct * c_prev[k] * f * (1.f - f) : 0.f;
          dgn[2 * H + j] = dct * i * (1.f - gg * gg);
          dgn[3 * H + j] = dht * tc * o * (1.f - o);
          dc[k] = dct * f;
        }
      }
      if (t > 0) product(false, false, N, H, G, dgt, G, w_hh, H, 0.f, dh, H, true);
    }
    product(true, false, G, I, T * N, dgates, G, x, I, 0.f, dw_ih, I);
    if (T > 1) product(true, false, G, H, (T - 1) * N, dgates + N * G, G, y, H, 0.f, dw_hh, H);
    else std::fill(dw_hh, dw_hh + G * H, 0.f);
    product(false, false, T * N, I, G, dgates, G, w_ih, I, 0.f, dx, I);
    // Bias gradient: column sums in double (so they do not depend on the batch's rounding), in
    // blocks of columns so the rows are read contiguously.
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static) if(T * N * G >= kParallelMin)
    for (int64_t j0 = 0; j0 < G; j0 += kBlock) {
      const int64_t width = std::min(kBlock, G - j0);
      double sum[kBlock] = {};
      for (int64_t r = 0; r < T * N; ++r)
        for (int64_t j = 0; j < width; ++j) sum[j] += dgates[r * G + j0 + j];
      for (int64_t j = 0; j < width; ++j) db_ih[j0 + j] = db_hh[j0 + j] = static_cast<float>(sum[j]);
    }
  }

 private:
  // C = op(A) op(B) + beta C: over all time steps at once, or one time step's product with W_hh
  // (`recurrent`: under bf16 its copy is kept between steps).
  void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc, bool recurrent = false) const {
    if (g_.bf16)
      bf16_gemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc, recurrent);
    else
      sgemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }

  LstmDirectionGeometry g_;
  HostBuffer gates_, cells_, dgates_, dh_, dc_;
};

}  // namespace

std::unique_ptr<LstmDirectionOp> make_gemm_lstm(const LstmDirectionGeometry& g) { return std::make_unique<GemmLstm>(g); }

}  // namespace trainer::models::cpu
