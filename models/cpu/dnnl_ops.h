// oneDNN-backed ops of the CPU backend: convolution, batch normalization, pooling.
#pragma once

#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

// In the settings' precision, by their algorithm (backend_settings.h).
std::unique_ptr<ConvOp> make_dnnl_conv(const ConvGeometry& g, const BackendSettings& settings);
std::unique_ptr<BatchNormOp> make_dnnl_batchnorm(const BatchNormGeometry& g);
std::unique_ptr<PoolOp> make_dnnl_pool(const PoolGeometry& g);

// y = x, reordered into y's layout (Backend::convert_layout).
void reorder_layout(const Tensor& x, Tensor& y);
// Copies an activation tensor to PyTorch's NCHW order (to_nchw) or fills it from NCHW.
void reorder_nchw(const Tensor& t, float* nchw, bool to_nchw);

}  // namespace trainer::models::cpu
