// The CPU backend's optimizer arithmetic (Backend::sgd_update, adam_update, sum_of_squares, scale):
// the loops optim/ ran on the host before the device seam, unchanged, so CPU results stay bit for bit.
#pragma once

#include <cstdint>

#include "models/backend.h"

namespace trainer::models::cpu {

void sgd_update(int64_t n, const SgdUpdate& u, float* params, const float* grads, float* momentum);
void adam_update(int64_t n, const AdamUpdate& u, float* params, const float* grads, float* m, float* v);
double sum_of_squares(int64_t n, const float* x);
void scale(int64_t n, float alpha, float* x);

}  // namespace trainer::models::cpu
