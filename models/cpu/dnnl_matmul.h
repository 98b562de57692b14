// The layers' GEMMs under runtime.precision = bf16 (dnnl_precision.h): C = alpha * op(A) op(B) +
// beta * C, row-major like Backend::gemm, computed by a oneDNN matmul from bf16 copies of A and B
// with fp32 accumulation into the fp32 C. One matmul (and the two reorders that make the copies)
// per call shape, made at the first call and kept, so a training step allocates nothing.
#pragma once

#include <cstdint>

namespace trainer::models::cpu {

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace trainer::models::cpu
