#include "models/cpu/lstm_ops.h"

#include <cstdlib>
#include <cstring>

namespace trainer::models::cpu {
namespace {
LstmAlgorithm g_algorithm = LstmAlgorithm::kDnnl;
}  // namespace

void set_lstm_algorithm(LstmAlgorithm algorithm) { g_algorithm = algorithm; }

std::unique_ptr<LstmDirectionOp> make_lstm_direction(const LstmDirectionGeometry& g) {
  LstmAlgorithm algorithm = g_algorithm;
  if (const char* env = std::getenv("TRAINER_LSTM")) {
    if (std::strcmp(env, "gemm") == 0) algorithm = LstmAlgorithm::kGemm;
    if (std::strcmp(env, "dnnl") == 0) algorithm = LstmAlgorithm::kDnnl;
  }
  return algorithm == LstmAlgorithm::kGemm ? make_gemm_lstm(g) : make_dnnl_lstm(g);
}

}  // namespace trainer::models::cpu
