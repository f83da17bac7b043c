#!/usr/bin/env bash
# Installs what tide needs (idempotent; quiet when all is present): the Debian packages,
# and the project's virtual environment .venv with LibTorch 2.x (the torch package tide
# builds against) and the Python test references.
# Usage: scripts/setup.sh
# Environment: TIDE_TORCH   the torch to install into .venv (default torch==2.13.0, the CPU
#                           build; torch==2.14.1 is the CUDA 13 build). On a GPU host whose
#                           python3 already has a CUDA torch >= 2.4, that one is used.
set -euo pipefail

PACKAGES=(
  build-essential cmake make pkg-config ccache git
  python3 python3-venv
  # Declarations only: ProcessGroupGloo.hpp includes gloo headers that PyTorch's wheels
  # do not ship (docs/building.md, "Gloo").
  libgloo-dev
  libjemalloc-dev
  libluajit-5.1-dev luajit
  libzmq3-dev cppzmq-dev
  libcereal-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libxxhash-dev libzstd-dev libicu-dev
  sentencepiece libsentencepiece-dev
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

root=$(cd "$(dirname "$0")/.." && pwd)

# LibTorch 2.x and the Python references, in .venv.
venv=$root/.venv
torch_spec=${TIDE_TORCH:-torch==2.13.0}
host_torch_ok() {
  python3 - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if torch.version.cuda and (major, minor) >= (2, 4) else 1)
PY
}
if [[ ! -x $venv/bin/python ]]; then
  if [[ -z ${TIDE_TORCH:-} ]] && host_torch_ok; then
    echo "setup: using the CUDA torch of $(command -v python3) (a GPU host's PyTorch)"
    python3 -m venv --system-site-packages "$venv"
  else
    python3 -m venv "$venv"
  fi
fi
# pip, without the warnings this machine kind's pip configuration prints for every package
# (a find-links folder that lacks most of them).
pip_install() {
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing $torch_spec into .venv"
  pip_install "$torch_spec"
fi
# Quick and offline when every pinned version is already there.
pip_install -r "$root/scripts/python-requirements.txt"
