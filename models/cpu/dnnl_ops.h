// oneDNN-backed ops of the CPU backend: convolution, batch normalization, pooling.
#pragma once

#include <memory>

#include "models/backend.h"

namespace trainer::models::cpu {

// Convolution algorithm: direct, Winograd (3x3 stride 1 only; falls back to direct elsewhere) or
// oneDNN's own choice. Set once per process before ops are made (runtime.conv_algorithm).
enum class ConvAlgorithm { kDirect, kWinograd, kAuto };
void set_conv_algorithm(ConvAlgorithm algorithm);

std::unique_ptr<ConvOp> make_dnnl_conv(const ConvGeometry& g);
std::unique_ptr<BatchNormOp> make_dnnl_batchnorm(const BatchNormGeometry& g);
std::unique_ptr<PoolOp> make_dnnl_pool(const PoolGeometry& g);

}  // namespace trainer::models::cpu
