#!/usr/bin/env bash
# Builds trainer and runs the whole test suite (unit, gradient checks, PyTorch parity, end to end).
#   scripts/test.sh [ctest args...]      e.g. -R parity
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j 2 "$@"
