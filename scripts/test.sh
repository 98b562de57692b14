#!/usr/bin/env bash
# Builds trainer and runs the whole test suite (unit, gradient checks, PyTorch parity, multi-rank,
# end to end), then every fuzz target for 30 s and every fuzz crash regression (scripts/fuzz; clang,
# build-fuzz/). Ends with the skipped tests and why, and the slowest tests and their seconds.
#   scripts/test.sh                  everything (what CI runs)
#   scripts/test.sh --fast           the everyday tier: unit and quick multi-rank tests, no end to end,
#                                    nothing slow, no fuzzing (67 s on 2 idle AVX2 cores; the
#                                    full ctest run 22 minutes there: docs/testing.md)
#   scripts/test.sh [--fast] [ctest args...]   e.g. -R parity, -L mpi (ctest args skip the fuzzing)
#   TRAINER_SKIP_FUZZ=1 scripts/test.sh        ctest only
# The tiers are ctest labels (tests/CMakeLists.txt): unit, mpi, e2e, slow.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ ${1:-} == --fast ]]; then
  fast=1
  shift
fi
scripts/build.sh
# Two tests at a time on two cores: OpenMP's spin-waiting would stall each test's parallel regions.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
junit=$PWD/build/Testing/ctest-junit.xml
rm -f "$junit"
# From ctest's JUnit file, printed last whatever happened: the tests skipped and why (a test says
# why on its output's "SKIPPED:" line, tests/skip.h, else on its last line), then the slowest.
summary() {
  [[ -s $junit ]] || return 0
  /usr/bin/python3 - "$junit" <<'EOF' || true
import sys, xml.etree.ElementTree as ET
cases = list(ET.parse(sys.argv[1]).iter("testcase"))
skipped = [c for c in cases if c.find("skipped") is not None]
if skipped:
    print("=== skipped: %d tests (a missing dependency or CPU feature; none of them passed) ===" % len(skipped))
    for c in skipped:
        lines = [l.strip() for l in (c.findtext("system-out") or "").splitlines() if l.strip()]
        why = next((l[len("SKIPPED:"):].strip() for l in lines if l.startswith("SKIPPED:")), lines[-1] if lines else "")
        print("  %s: %s" % (c.get("name"), why))
print("=== the slowest tests of this run (seconds; the machine's load counts too) ===")
timed = [(float(c.get("time") or 0), c.get("status") or "", c.get("name")) for c in cases]
for seconds, status, name in sorted(timed, reverse=True)[:15]:
    print("%8.1f  %s%s" % (seconds, name, "" if status in ("run", "") else "  (" + status + ")"))
print("%8.1f  in all, %d tests" % (sum(t[0] for t in timed), len(timed)))
EOF
}
trap summary EXIT
tier=()
if ((fast)); then
  tier=(-LE 'e2e|slow')
fi
if ! (cd build && ctest --output-on-failure -j 2 --output-junit "$junit" "${tier[@]}" "$@"); then
  # A log is often read from its end (CI keeps only the tail): repeat each failure's output there.
  echo "=== the failed tests once more, one at a time, so that their output ends the log ==="
  (cd build && ctest --rerun-failed --output-on-failure) || true
  exit 1
fi
if [[ ${TRAINER_SKIP_FUZZ:-0} != 1 && $fast == 0 && $# -eq 0 ]]; then
  scripts/fuzz all "${TRAINER_FUZZ_SECONDS:-30}"
fi
