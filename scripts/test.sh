#!/usr/bin/env bash
# Builds trainer and runs the whole test suite (unit, gradient checks, PyTorch parity, end to end),
# then every fuzz target for 30 s and every fuzz crash regression (scripts/fuzz; clang, build-fuzz/).
#   scripts/test.sh [ctest args...]      e.g. -R parity (ctest args skip the fuzzing)
#   TRAINER_SKIP_FUZZ=1 scripts/test.sh  ctest only
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# Two tests at a time on two cores: OpenMP's spin-waiting would stall each test's parallel regions.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
if ! (cd build && ctest --output-on-failure -j 2 "$@"); then
  # A log is often read from its end (CI keeps only the tail): repeat each failure's output there.
  echo "=== the failed tests once more, one at a time, so that their output ends the log ==="
  (cd build && ctest --rerun-failed --output-on-failure) || true
  exit 1
fi
if [[ ${TRAINER_SKIP_FUZZ:-0} != 1 && $# -eq 0 ]]; then
  scripts/fuzz all "${TRAINER_FUZZ_SECONDS:-30}"
fi
