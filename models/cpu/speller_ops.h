// CPU loops behind the Backend's row and speller ops (backend.h documents each one): the loops
// Listen-Attend-Spell ran on its buffers before they were backend ops (models/nets/las.cpp), moved
// here unchanged, so the CPU model computes the same bits as before.
#pragma once

#include <cstdint>

namespace trainer::models::cpu {

void swap_axes(int64_t outer, int64_t a, int64_t b, int64_t cols, const float* x, float* y);
void copy_2d(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy);
void gather_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y);
void scatter_rows(int64_t count, int64_t cols, const int32_t* index, const float* x, float* y);

void embedding_forward(int64_t rows, int64_t dim, const int32_t* tokens, const float* table, float* y, int64_t ldy);
void embedding_backward(int64_t rows, int64_t dim, const int32_t* tokens, const float* dy, int64_t ldy,
                        float* dtable);
void select_tokens(int64_t rows, int64_t classes, const float* logits, const int32_t* use_model,
                   const int32_t* truth, int32_t* tokens);

void lstm_cell_forward(int64_t rows, int64_t hidden, float* gates, const float* c_prev, float* c, float* h,
                       float* tanh_c);
void lstm_cell_backward(int64_t rows, int64_t hidden, const float* gates, const float* c_prev, const float* tanh_c,
                        const float* dh, float* dc, float* dgates);

// The attention's energies and weighted sums are the CPU backend's own GEMMs (as the model called
// them), so the sums round as they did.
void attention_forward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                       const int32_t* row_utterance, const float* query, const float* keys, const float* values,
                       float* alpha, float* context, int64_t ldc);
void attention_backward(int64_t rows, int64_t steps, int64_t dim, int64_t cols, const int32_t* lengths,
                        const int32_t* row_utterance, const float* keys, const float* values, const float* alpha,
                        const float* dcontext, float* denergy, float* dquery);

}  // namespace trainer::models::cpu
