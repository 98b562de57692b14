// Gradient clipping by global L2 norm over the flat gradient buffer (torch.nn.utils.clip_grad_norm_
// over all parameters at once), through the backend the gradient lives on.
//
// The norm is the backend's sum_of_squares: accumulated in double over fixed blocks that are summed
// in a fixed order, so it is the same bit for bit whatever the thread count: a resumed run, or one
// with a different number of threads, clips identically.
#pragma once

#include <cstdint>

namespace trainer::models {
class Backend;
}

namespace trainer::optim {

// sqrt(sum of squares) of x[0, n) (device memory of `backend`).
double global_norm(models::Backend& backend, const float* x, int64_t n);

// Scales grads[0, n) in place by coef = max_norm / (norm + 1e-6) when coef < 1 (PyTorch's rule; the
// 1e-6 keeps a zero gradient finite) and leaves them untouched otherwise. Returns the norm before
// clipping, which is what training logs report. max_norm <= 0 means "no clipping": only the norm is
// computed.
double clip_grad_norm(models::Backend& backend, float* grads, int64_t n, double max_norm);

// The coefficient clip_grad_norm scales by, as the float the scale applies: max_norm / (norm +
// 1e-6) when that is below 1, else 1 (and 1 for max_norm <= 0). The trainer hands it to the
// optimizer's update (Optimizer::step's grad_scale) instead of scaling the gradient in a pass of its own.
float clip_coefficient(double norm, double max_norm);

}  // namespace trainer::optim
