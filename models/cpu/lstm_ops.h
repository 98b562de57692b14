// The CPU backend's two LSTM implementations (one direction of one layer; see LstmOp in backend.h):
//  - kDnnl: oneDNN's vanilla_lstm primitive (forward_training + backward), weights reordered from
//    PyTorch's layout into the primitive's packed layouts once per step;
//  - kGemm: OpenBLAS GEMMs: the input projection of all time steps in one GEMM, then per step one
//    recurrent GEMM and a fused loop over the gate nonlinearities; backward mirrors it and gets the
//    weight gradients from one GEMM each over all time steps.
// Both compute the same function. The default is oneDNN, the faster at DeepSpeech's shapes (T 150,
// N 8, hidden 800, one thread, forward + backward): 375 ms against 550 ms from input 800, 512 against
// 680 ms from input 1312 (torch.nn.LSTM: 880 and 1000 ms). OpenBLAS repacks W_hh for each small
// per-step GEMM, where oneDNN keeps it packed.
#pragma once

#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

enum class LstmAlgorithm { kDnnl, kGemm };
// Applies to ops made afterwards. The environment variable TRAINER_LSTM=dnnl|gemm overrides it.
void set_lstm_algorithm(LstmAlgorithm algorithm);

std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g);
std::unique_ptr<LstmOp> make_dnnl_lstm(const LstmGeometry& g);
std::unique_ptr<LstmOp> make_gemm_lstm(const LstmGeometry& g);

}  // namespace trainer::models::cpu
