#include "models/cpu/lstm_ops.h"

#include <cstdlib>
#include <cstring>

namespace trainer::models::cpu {

std::unique_ptr<LstmDirectionOp> make_lstm_direction(const LstmDirectionGeometry& g, LstmAlgorithm algorithm) {
  if (const char* env = std::getenv("TRAINER_LSTM")) {
    if (std::strcmp(env, "gemm") == 0) algorithm = LstmAlgorithm::kGemm;
    if (std::strcmp(env, "dnnl") == 0) algorithm = LstmAlgorithm::kDnnl;
  }
  if (algorithm == LstmAlgorithm::kAuto) algorithm = g.bf16 ? LstmAlgorithm::kGemm : LstmAlgorithm::kDnnl;
  return algorithm == LstmAlgorithm::kGemm ? make_gemm_lstm(g) : make_dnnl_lstm(g);
}

}  // namespace trainer::models::cpu
