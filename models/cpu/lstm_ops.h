// The CPU backend's LSTM. LstmOp (backend.h) is a whole LSTM; the CPU runs it as a loop over layers
// and directions (lstm_stack.cpp) around one op per direction of one layer, which has two
// implementations:
//  - kDnnl: oneDNN's vanilla_lstm primitive (forward_training + backward), weights reordered from
//    PyTorch's layout into the primitive's packed layouts once per step;
//  - kGemm: OpenBLAS GEMMs (under bf16 oneDNN's bf16 matmuls): the input projection of all time
//    steps in one GEMM, then per step one recurrent GEMM and a fused loop over the gate
//    nonlinearities; backward mirrors it and gets the weight gradients from one GEMM each over all
//    time steps.
// Both compute the same function. In fp32 the default is oneDNN, the faster at DeepSpeech's shapes
// (T 150, N 8, hidden 800, one thread, forward + backward): 375 ms against 550 ms from input 800, 512
// against 680 ms from input 1312 (torch.nn.LSTM: 880 and 1000 ms). OpenBLAS repacks W_hh for each
// small per-step GEMM, where oneDNN keeps it packed. Under bf16 the default is the GEMM op, whose
// products are oneDNN bf16 matmuls on a W_hh copy kept for the whole step: oneDNN 3.2's bf16 RNN
// backward (brgemm, avx512_core_bf16) is slower than its fp32 one, 2,730 ms of a DeepSpeech step at
// batch 8 x 300 frames against the GEMM op's 640 (fp32: 1,039; docs/benchmarks-journal.md, "bf16
// LSTMs on our GEMMs, and the engine on oneDNN 3.2 at AVX-512 (issue 52, 2026-12-02, later)").
#pragma once

#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

// The whole LSTM (backend.h's contract): the layer loop of lstm_stack.cpp over direction ops of
// the settings' lstm_algorithm, in their precision (backend_settings.h).
std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g, const BackendSettings& settings);

// One direction of one layer over full-length sequences from a zero initial state: what the stack
// runs per (layer, direction), the reverse direction on time-reversed sequences.
struct LstmDirectionGeometry {
  int64_t seq_len = 0, batch = 0, input = 0, hidden = 0;
  // runtime.precision = bf16: both ops compute their products from bf16 copies (lstm_dnnl.cpp,
  // lstm_gemm.cpp).
  bool bf16 = false;
};

class LstmDirectionOp {
 public:
  virtual ~LstmDirectionOp() = default;
  // x {T, N, I} time-major; w_ih {4H, I}, w_hh {4H, H}, b_ih {4H}, b_hh {4H}; y {T, N, H}.
  // Training keeps what backward needs (gate activations and cell states) inside the op.
  virtual void forward(const float* x, const float* w_ih, const float* w_hh, const float* b_ih,
                       const float* b_hh, float* y, bool training) = 0;
  // Gradients of the last training forward, given its x, weights and output y (unchanged since).
  // Overwrites dx, dw_ih, dw_hh, db_ih, db_hh (the two biases get the same gradient).
  virtual void backward(const float* x, const float* w_ih, const float* w_hh, const float* y, const float* dy,
                        float* dx, float* dw_ih, float* dw_hh, float* db_ih, float* db_hh) = 0;
};

// `algorithm`'s implementation (kAuto: by precision, above); TRAINER_LSTM=dnnl|gemm overrides it.
std::unique_ptr<LstmDirectionOp> make_lstm_direction(const LstmDirectionGeometry& g, LstmAlgorithm algorithm);
std::unique_ptr<LstmDirectionOp> make_dnnl_lstm(const LstmDirectionGeometry& g);
std::unique_ptr<LstmDirectionOp> make_gemm_lstm(const LstmDirectionGeometry& g);

}  // namespace trainer::models::cpu
