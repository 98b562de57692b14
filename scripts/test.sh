#!/usr/bin/env bash
# Builds trainer and runs the whole test suite (unit, gradient checks, PyTorch parity, end to end).
#   scripts/test.sh [ctest args...]      e.g. -R parity
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
# Two tests at a time on two cores: OpenMP's spin-waiting would stall each test's parallel regions.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
ctest --output-on-failure -j 2 "$@"
