// The layers' GEMMs under runtime.precision = bf16 (dnnl_precision.h): C = alpha * op(A) op(B) +
// beta * C, row-major like Backend::gemm, computed by a oneDNN matmul from bf16 copies of A and B
// with fp32 accumulation into the fp32 C. One matmul (and the two reorders that make the copies)
// per call shape, made at the first call and kept, so a training step allocates nothing.
#pragma once

#include <cstdint>

namespace trainer::models::cpu {

// keep_b: B is a model weight that many calls read unchanged (LAS's speller reads each of its
// weights once per time step, forward and backward; an LSTM its W_hh): B's bf16 copy, in the layout
// the matmul reads, is made at the first call after bf16_weights_changed() and kept, so that a
// training step rounds each weight once instead of once per call (a per-call copy reads 4 bytes and
// writes 2 for every 2 the product reads: more traffic than the fp32 product's).
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool keep_b = false);
// Every kept weight copy is stale from here on: the weights may have new values.
void bf16_weights_changed();

}  // namespace trainer::models::cpu
