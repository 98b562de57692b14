// The precision the CPU backend computes convolutions, LSTMs and the layers' GEMMs in (runtime.precision,
// BackendSettings::precision; architecture.md section 2, "Precision").
//
// kBf16 is mixed precision as PyTorch's CPU autocast defines it: parameters, activations in memory,
// gradients, optimizer state and the gradient sync stay fp32; each convolution, LSTM and layer GEMM
// rounds its operands (weights, activations, incoming gradients) to bf16 copies and accumulates in
// fp32 into an fp32 result. Batch norm, pooling, softmax, the losses and every reduction stay fp32.
// oneDNN has bf16 kernels from AVX-512 on: native with avx512_bf16 or AMX, emulated (slower,
// same results) on plain avx512_core; below that it has none, not even a reference one.
#pragma once

#include "models/backend_settings.h"

namespace trainer::models::cpu {

// Whether oneDNN has bf16 kernels at the ISA it dispatches for.
bool dnnl_has_bf16();
// Throws std::invalid_argument, one line naming runtime.precision (and the ISA), where the CPU
// backend cannot compute in `precision`: kTf32 anywhere, kBf16 where oneDNN dispatches below
// AVX-512 (ONEDNN_MAX_CPU_ISA applies). The CPU backend checks it when it is made.
void require_precision(Precision precision);

}  // namespace trainer::models::cpu
