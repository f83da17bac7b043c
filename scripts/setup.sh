#!/usr/bin/env bash
# Installs the Debian packages tide needs (idempotent; quiet when all are present).
# Usage: scripts/setup.sh [--with-extras]
set -euo pipefail

PACKAGES=(
  build-essential cmake make pkg-config ccache git
  libtorch-dev libgloo-dev
  # Debian's LibTorch calls the system libblas.so.3; without an optimized one every
  # matmul goes through the reference BLAS. OpenMP OpenBLAS measured fastest here.
  libopenblas0-openmp libopenblas-openmp-dev
  libjemalloc-dev
  libluajit-5.1-dev luajit
  libzmq3-dev cppzmq-dev
  libcereal-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libxxhash-dev libzstd-dev libicu-dev
  sentencepiece libsentencepiece-dev
  python3-torch python3-zmq python3-numpy
  # The Go binding (bindings/go, cgo).
  golang-go
  # The bundled default corpus (King James Bible, public domain).
  bible-kjv
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Rust binding (bindings/rust) builds with any cargo: a rustup one in ~/.cargo/bin
# where the machine has it, else Debian's.
if ! command -v cargo >/dev/null && [[ ! -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
  SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get install -y -qq --no-install-recommends cargo >/dev/null
fi

# Point libblas.so.3 at OpenBLAS (OpenMP build) if the reference BLAS is selected.
alt=libblas.so.3-x86_64-linux-gnu
want=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
if [[ -e $want ]] && ! update-alternatives --query "$alt" 2>/dev/null | grep -q "^Value: $want"; then
  SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO update-alternatives --quiet --set "$alt" "$want"
fi
alt=liblapack.so.3-x86_64-linux-gnu
want=/usr/lib/x86_64-linux-gnu/openblas-openmp/liblapack.so.3
if [[ -e $want ]] && ! update-alternatives --query "$alt" 2>/dev/null | grep -q "^Value: $want"; then
  SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO update-alternatives --quiet --set "$alt" "$want"
fi

# Reference implementations the tests compare against (npm registry; pinned by
# tests/js/package-lock.json). Node comes with this machine kind; Debian's otherwise.
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [[ ! -d $root/tests/js/node_modules/@huggingface/tokenizers ]]; then
  echo "setup: installing test references (npm ci in tests/js)"
  (cd "$root/tests/js" && npm ci --silent --no-audit --no-fund)
fi
