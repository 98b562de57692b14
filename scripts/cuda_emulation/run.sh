#!/usr/bin/env bash
# The CUDA parity tests on a machine without a GPU: our kernels (models/cuda/*.cu) run on the host,
# each CUDA thread a fiber of the launching thread, run cooperatively barrier to barrier
# (cuda_runtime.h here), through the CUDA backend's own launching
# methods (models/cuda/cuda_backend.cpp); cuDNN's and cuBLAS's ops are the CPU backend's there, so
# what this checks is our kernels and their wiring, not cuDNN or cuBLAS, nor timing, nor the
# memory model beyond barriers. A GPU run (scripts/gpu_check.sh) remains the test.
#
#   scripts/cuda_emulation/run.sh [ctest args...]     e.g. -R speller
# Builds in build-emulation/ (a CPU build with -DTRAINER_CUDA_EMULATION_ALL=ON: every case, where the
# suite, scripts/test.sh, runs a fast subset), runs the emulated_* tests and then emulated_coverage,
# which checks that they called every emulated launching method (skipped when ctest args are given:
# a part of the tests need not call them all).
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-emulation -G Ninja -DTRAINER_CUDA_EMULATION=ON -DTRAINER_CUDA_EMULATION_ALL=ON -DTRAINER_NATIVE=OFF >/dev/null
targets=(emulated_cuda_backend_test emulated_cuda_sequence_test emulated_cuda_speller_test emulated_cuda_speech_models_test
         emulated_cuda_precision_test emulated_cuda_compressors_test emulated_cuda_low_bit_test
         emulated_cuda_wire_test)
ninja -C build-emulation "${targets[@]/#/tests/}"
cd build-emulation
if (($#)); then
  ctest --output-on-failure -R '^emulated_cuda_' -FA emulated_calls "$@"
else
  ctest --output-on-failure -R '^emulated_'
fi
