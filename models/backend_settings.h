// What a backend is told when it is made: runtime.precision, runtime.deterministic and the
// convolution and LSTM algorithms. A backend keeps them as members and hands them to the ops it
// makes; nothing reads them from process-wide state, so backends with different settings can live
// in one process (the tests make an fp32 and a bf16 one side by side).
#pragma once

namespace trainer::models {

// runtime.precision (architecture.md section 2, "Precision"). kTf32 is a GPU tensor-core mode: the
// CPU backend refuses it. kBf16 is autocast's mixed precision on both backends.
enum class Precision { kFp32, kTf32, kBf16 };

// The CPU's convolution algorithm: direct everywhere; Winograd F(4,3) wherever oneDNN has it (3x3,
// stride 1, blocked layouts); or kAuto: Winograd where it measured faster (from 32 channels).
enum class ConvAlgorithm { kAuto, kDirect, kWinograd };

// The CPU's LSTM implementation (models/cpu/lstm_ops.h): oneDNN's primitive, our GEMM one, or kAuto:
// oneDNN's in fp32 and ours under bf16, the faster of the two in each (lstm_ops.h).
enum class LstmAlgorithm { kAuto, kDnnl, kGemm };

struct BackendSettings {
  Precision precision = Precision::kFp32;
  // runtime.deterministic: the CUDA backend keeps convolutions to cuDNN's deterministic algorithms
  // (models/cuda/cuda_backend.h). The CPU's ops are deterministic either way; the trainer pins its
  // convolutions to kDirect as well (trainer/experiment.cpp).
  bool deterministic = false;
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kAuto;  // CPU only
  LstmAlgorithm lstm_algorithm = LstmAlgorithm::kAuto;  // CPU only; TRAINER_LSTM=dnnl|gemm overrides it
  bool operator==(const BackendSettings& o) const {
    return precision == o.precision && deterministic == o.deterministic && conv_algorithm == o.conv_algorithm &&
           lstm_algorithm == o.lstm_algorithm;
  }
};

}  // namespace trainer::models
