// CPU loops behind the Backend's sequence ops (backend.h documents each one): masking, reversing
// and packing padded time-major batches, Hardtanh, the lookahead convolution, CTC, and the moves
// between a convolutional front end's images and an RNN's sequences.
#pragma once

#include <cstdint>
#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

void sequence_gather(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, bool reverse,
                     const float* src, int64_t src_ld, float* dst, int64_t dst_ld);
void pack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* x,
                    float* packed);
void unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const int32_t* lengths, const float* packed,
                      float* x);

void hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y);
void hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx);

void lookahead_forward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                       const float* w, float* y);
void lookahead_backward(int64_t steps, int64_t batch, int64_t channels, int64_t context, const float* x,
                        const float* w, const float* dy, float* dx, float* dw);

void ctc_loss(int64_t steps, int64_t batch, int64_t classes, const float* logits, const int32_t* frames,
              const int32_t* labels, const int32_t* label_lengths, float grad_scale, double* losses,
              float* dlogits);

// image {N, C, H, W} <-> sequence {W, N, C*H} (to_sequence picks the direction).
void image_sequence_reorder(const Tensor& image, float* sequence, bool to_sequence);
void mask_width(const Tensor& x, const int32_t* lengths);
void transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y);

}  // namespace trainer::models::cpu
