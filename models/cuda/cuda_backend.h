// The CUDA backend: the Backend (models/backend.h) of the models on one GPU. cuDNN for
// convolution, pooling and the LSTM (cudnn_ops.h), cuBLAS for GEMM, our own kernels for the rest
// (kernels.h), all on the stream of the process's CUDA device (cuda_device.h), FP32 math (TF32
// only under runtime.precision = "tf32"), in the settings it is made with (models/backend_settings.h).
//
// Activations are channels-last (NHWC): the layout the Layout enum (models/tensor.h) already has,
// the one the inputs arrive in, and the one cuDNN's fastest FP32/TF32 convolutions on Ampere and
// Hopper take; batch norm's statistics are then column sums over a {N*H*W, C} matrix.
//
// The speech models' ops are our own kernels too (sequence.cu, lookahead.cu, ctc.cu; LAS's rows,
// cells and attention in speller.cu, attention.cu; a batch's lengths stay host arrays and reach the
// kernels as parameters, host_ints.h), except the LSTM, which is cuDNN's (cudnn_lstm.cpp).
// Compiled only with cmake -DTRAINER_CUDA=ON.
#pragma once

#include <cstdint>

#include "models/backend.h"

namespace trainer::models::cuda {

// The process's CUDA backend with `settings`, on GPU local_rank % visible GPUs (cuda_device): made on
// first use, the same object afterwards (one per local rank and settings; all share the device's
// stream). Throws std::runtime_error ("no usable GPU: ...") without a GPU. What the settings do here:
//
// deterministic: true keeps convolutions to cuDNN's deterministic algorithms, chosen by cuDNN's
// heuristics rather than by timing, so that every process chooses the same (a run repeats bit for
// bit on the same GPU; resume is bit-exact); false (the default, as PyTorch's cudnn.deterministic)
// takes the fastest, which for backward filter is usually one that sums with atomics, so the last
// bits vary from run to run.
//
// Precision::kTf32: cuBLAS GEMMs (CUBLAS_TF32_TENSOR_OP_MATH) and cuDNN convolutions and LSTMs
// (CUDNN_DEFAULT_MATH instead of CUDNN_FMA_MATH) may multiply on TF32 tensor cores (10-bit mantissa
// inputs, fp32 accumulation and data).
//
// Precision::kBf16, as on the CPU (models/cpu/dnnl_precision.h): convolutions (cuDNN) and the
// layers' GEMMs (layer_gemm, cuBLAS) read bf16 copies of their operands and accumulate in fp32 on
// tensor cores; parameters, activations in memory, gradients, batch norm, pooling, the LSTM, the
// losses and the optimizer stay fp32. cuDNN's bf16 convolutions write bf16 outputs, so a
// convolution's output and its input and weight gradients are also rounded to bf16 once (as under
// PyTorch's autocast) before they are widened into the fp32 tensors.
//
// The conv and LSTM algorithms are the CPU's and not read here.
Backend& cuda_backend(int local_rank, const BackendSettings& settings = {});

// How many cudnnFind* searches (three timed calls each, one per direction) the convolutions of this
// process have run: at most one per layer and length class (length_class.h), none under
// runtime.deterministic (cudnn_conv.cpp). For tests and the log.
int64_t convolution_searches();

}  // namespace trainer::models::cuda
