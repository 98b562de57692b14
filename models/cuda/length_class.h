// Length classes for the CUDA convolution's algorithm choice (cudnn_conv.cpp), so that a run whose
// shapes change every step still runs a bounded number of algorithm searches.
//
// Speech batches are padded to their own longest utterance (data/speech_loader.h), so DeepSpeech's
// convolutions see a new time extent almost every step. cudnnFind* times every candidate algorithm
// (three searches per convolution, each with workspaces up to 1 GiB and synchronizing frees), which
// costs more than the step itself. The CUDA convolution therefore remembers its choice per length
// class: each spatial extent rounded up to one of four steps per octave (at most 25% above the
// extent), and a geometry whose class was searched before reuses that search's algorithms when cuDNN
// accepts them for it. The padding, the tensors and every CPU result stay as they are: only which
// cuDNN algorithm computes a geometry depends on the class.
//
// Header-only and free of CUDA, so the CPU build tests it (tests/cuda_length_class_test.cpp).
#pragma once

#include <cstdint>

namespace trainer::models::cuda {

// Up to kExactLengths an extent is its own class (small images, kernels' edges); above it, n in
// (p, 2p] (p a power of two) rounds up to a multiple of p / 4: classes p + p/4, p + p/2, p + 3p/4, 2p.
constexpr int64_t kExactLengths = 16;
constexpr int64_t kClassesPerOctave = 4;

constexpr int64_t length_class(int64_t n) {
  if (n <= kExactLengths) return n;
  int64_t p = kExactLengths;
  while (2 * p < n) p *= 2;  // p < n <= 2p
  const int64_t step = p / kClassesPerOctave;
  return (n + step - 1) / step * step;
}

}  // namespace trainer::models::cuda
