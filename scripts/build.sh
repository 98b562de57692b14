#!/usr/bin/env bash
# Installs the Debian packages (if missing), configures and builds trainer into build/.
#   scripts/build.sh [extra cmake args...]      e.g. -DTRAINER_NATIVE=OFF for a portable binary
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif (($#)); then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build -j "$(nproc)"
