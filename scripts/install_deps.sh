#!/usr/bin/env bash
# Installs the Debian packages trainer needs. Idempotent and quiet when everything is present.
#   scripts/install_deps.sh           build + test dependencies, and espeak-ng and sox, which
#                                     synthesize the default speech corpus (the main job's data)
#   scripts/install_deps.sh --bench   also PyTorch (reference timings and test-fixture generation)
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build
  libdnnl-dev                       # oneDNN 2.6: CPU conv/BN/pool/matmul/LSTM primitives
  libopenblas-dev libopenblas0-openmp  # OpenMP build: the pthread build fights OpenMP threads
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev catch2
  libsndfile1-dev libfftw3-dev
  python3 python3-numpy python3-matplotlib  # trainer report (scripts/report.py)
  espeak-ng sox                     # scripts/make_speech_corpus
  clang libclang-rt-dev zlib1g-dev  # scripts/fuzz: libFuzzer, ASan, UBSan (zlib: checkpoint target)
  iproute2                          # scripts/netem: namespaces, veth, bridge, tc
)
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(python3-torch) ;;
    *) echo "install_deps.sh: unknown option '$arg' (use --bench)" >&2; exit 2 ;;
  esac
done

sudo_cmd=""
[[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian registers the pthread and OpenMP OpenBLAS builds as alternatives; choose the OpenMP one so
# BLAS calls share the OpenMP thread pool instead of oversubscribing the cores.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  want=/usr/lib/$arch/openblas-openmp/$lib
  if [[ -e $want && $(readlink -f "/etc/alternatives/$lib-$arch" 2>/dev/null) != "$want" ]]; then
    ${sudo_cmd:-} update-alternatives --quiet --set "$lib-$arch" "$want"
  fi
done
