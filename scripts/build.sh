#!/usr/bin/env bash
# Installs the Debian packages (if missing), configures and builds trainer into build/.
#   scripts/build.sh [extra cmake args...]      e.g. -DTRAINER_NATIVE=OFF for a portable binary
#   scripts/build.sh --target trainer [...]     only that target and what it needs (the quickstart:
#                                               the program, not the 300 test targets)
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
if [[ ${1:-} == --target ]]; then
  target=(--target "$2")
  shift 2
fi
scripts/install_deps.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif (($#)); then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build -j "$(nproc)" "${target[@]}"
