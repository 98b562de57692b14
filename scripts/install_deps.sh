#!/usr/bin/env bash
# Installs the Debian packages trainer needs, and oneDNN 3.2 into the project-local prefix
# .deps/onednn-3.2 (Debian 12 ships only oneDNN 2.6). Idempotent and quiet when everything is present.
#   scripts/install_deps.sh           build + test dependencies, and espeak-ng and sox, which
#                                     synthesize the default speech corpus (the main job's data)
#   scripts/install_deps.sh --bench   also PyTorch (reference timings and test-fixture generation)
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build
  libopenblas-dev libopenblas0-openmp  # OpenMP build: the pthread build fights OpenMP threads
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev catch2
  libsndfile1-dev libfftw3-dev
  python3 python3-numpy python3-matplotlib  # trainer report (scripts/report.py)
  python3-pip unzip                 # fetch and unpack the oneDNN 3.2 wheels (below)
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

# oneDNN 3.2, the CPU engine (conv, batch norm, pooling, matmul, LSTM, reorders). PyPI's GNU-OpenMP
# build of it (onednn-cpu-gomp, with its headers and CMake config in onednn-devel-cpu-gomp) needs
# only libgomp and the C/C++ runtime, and shares the OpenMP thread pool of OpenBLAS and our loops.
# pip fetches the two pinned wheels and checks their hashes; nothing of Python is needed at run
# time: CMake finds the prefix (dnnl_DIR) and links it with a run path.
onednn_prefix="$(cd "$(dirname "$0")/.." && pwd)/.deps/onednn-3.2"
onednn_stamp="$onednn_prefix/.installed-2023.2.0"
if [[ ! -e $onednn_stamp ]]; then
  echo "install_deps: installing oneDNN 3.2 (PyPI onednn-cpu-gomp 2023.2.0) into $onednn_prefix"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cat >"$work/requirements.txt" <<'REQ'
onednn-cpu-gomp==2023.2.0 --hash=sha256:2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb
onednn-devel-cpu-gomp==2023.2.0 --hash=sha256:9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
REQ
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$work/requirements.txt" -d "$work/wheels"
  for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/unpacked"; done
  rm -rf "$onednn_prefix"
  mkdir -p "$onednn_prefix"
  for data in "$work"/unpacked/*.data/data; do cp -a "$data"/. "$onednn_prefix"/; done
  # The wheel holds three copies of the library (zip has no links); keep one.
  (cd "$onednn_prefix/lib" && ln -sf libdnnl.so.3.2 libdnnl.so.3 && ln -sf libdnnl.so.3 libdnnl.so)
  touch "$onednn_stamp"
fi
