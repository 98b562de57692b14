// oneDNN-backed ops of the CPU backend: convolution, batch normalization, pooling.
#pragma once

#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

// Convolution algorithm: direct everywhere; Winograd F(4,3) wherever oneDNN has it (3x3, stride 1,
// blocked layouts); or kAuto (default): Winograd where it measured faster (from 32 channels).
// Set once per process before ops are made.
enum class ConvAlgorithm { kDirect, kWinograd, kAuto };
void set_conv_algorithm(ConvAlgorithm algorithm);

std::unique_ptr<ConvOp> make_dnnl_conv(const ConvGeometry& g);
std::unique_ptr<BatchNormOp> make_dnnl_batchnorm(const BatchNormGeometry& g);
std::unique_ptr<PoolOp> make_dnnl_pool(const PoolGeometry& g);

// y = x, reordered into y's layout (Backend::convert_layout).
void reorder_layout(const Tensor& x, Tensor& y);
// Copies an activation tensor to PyTorch's NCHW order (to_nchw) or fills it from NCHW.
void reorder_nchw(const Tensor& t, float* nchw, bool to_nchw);

}  // namespace trainer::models::cpu
