#!/usr/bin/env bash
# Installs what tide needs (idempotent; quiet when all is present): the system packages,
# and the project's virtual environment .venv with LibTorch 2.x (the torch package tide
# builds against) and the Python test references.
# Usage: scripts/setup.sh [--cuda]
# The torch of .venv, first match wins:
#   TIDE_TORCH (a pip requirement, e.g. torch==2.13.0+cpu);
#   python3's own CUDA build of torch >= 2.5 (a GPU host's PyTorch; .venv sees it);
#   torch==2.14.1, the CUDA 13 build, where a CUDA toolkit is installed (nvcc) and the disk
#     has 10 GiB free: one build then compiles the CUDA code and runs the CPU tests;
#   torch==2.13.0+cpu, the CPU build, from PyTorch's CPU index (PyPI's Linux torch is a
#     CUDA build, which CMake cannot use without a CUDA toolkit).
# --cuda (make gpu-demo, make gpu-test): fail unless that torch is a CUDA build.
# Debian 12 and Ubuntu 24.04 (apt; the same package names but Chromium's). Ubuntu 22.04
# lacks two of the libraries (see below).
set -euo pipefail

cuda=0
case "${1:-}" in
  "") ;;
  --cuda) cuda=1 ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown option '$1' (scripts/setup.sh [--cuda])" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake make ninja-build pkg-config ccache git
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
  # tided's /metrics: prometheus-cpp's metric families and text serializer.
  prometheus-cpp-dev
  libxxhash-dev libzstd-dev libicu-dev
  sentencepiece libsentencepiece-dev
  # The Go binding (bindings/go, cgo).
  golang-go
  # make test's format and tidy checks (scripts/lint.sh), and fuzz.inputs' Clang with
  # its libFuzzer runtime (tests/fuzz/run.sh).
  clang-format-14 clang-tidy-14 clang-14 libclang-rt-14-dev
  # The bundled default corpus (King James Bible, public domain).
  bible-kjv
  # parallel.slurm: a private Slurm cluster runs examples/slurm (tests/parallel/private_slurm.sh).
  slurmctld slurmd slurm-client munge
  # daemon.dashboard: the dashboard in headless Chromium, driven by Selenium.
  chromium chromium-driver python3-selenium
  # daemon.http: a self-signed certificate for tided's HTTPS.
  openssl
  # The "hosts" of the multi-host tests are network namespaces (ip netns); container
  # images of Debian and Ubuntu come without iproute2.
  iproute2
)

# The package names are Debian 12's; Ubuntu 24.04 has the same ones (in universe, enabled
# on its standard images) but for Chromium, which Ubuntu packages only as a snap, under
# other names (daemon.dashboard skips where snapd cannot run it).
if [[ -r /etc/os-release ]]; then
  os=$(. /etc/os-release && echo "${ID:-?} ${VERSION_ID:-?}")
  case $os in
    "debian 12") ;;
    "ubuntu 22.04")
      echo "setup: Ubuntu 22.04 packages neither prometheus-cpp (tided's /metrics) nor cppzmq's" \
           "CMake package (its zmq.hpp comes bare in libzmq3-dev); use Ubuntu 24.04 or Debian 12" >&2
      exit 1 ;;
    "ubuntu 24.04")
      for i in "${!PACKAGES[@]}"; do
        case ${PACKAGES[i]} in
          chromium) PACKAGES[i]=chromium-browser ;;
          chromium-driver) PACKAGES[i]=chromium-chromedriver ;;
        esac
      done ;;
    *) echo "setup: $os is not Debian 12 or Ubuntu 24.04; trying its apt anyway" >&2 ;;
  esac
fi

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

# The dashboard's chart library (uPlot), pinned by ipc/web/package-lock.json, compiled into
# tided (cmake/EmbedWeb.cmake). npm from the machine's Node.js where it has one (it may be
# NodeSource's, which Debian's npm package conflicts with), else Debian's.
if ! command -v npm >/dev/null; then
  SUDO=""; if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
web=$root/ipc/web
if [[ ! -f $web/node_modules/.package-lock.json ]] ||
   ! cmp -s <(sed -n '/"node_modules\//,$p' "$web/package-lock.json") \
             <(sed -n '/"node_modules\//,$p' "$web/node_modules/.package-lock.json"); then
  echo "setup: npm ci in ipc/web (uPlot for the dashboard)"
  (cd "$web" && npm ci --no-audit --no-fund --loglevel=error)
fi

# LibTorch 2.x and the Python references, in .venv.
venv=$root/.venv
host_torch_ok() {
  python3 - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if torch.version.cuda and (major, minor) >= (2, 5) else 1)
PY
}
cuda_toolkit() { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }
# The CUDA build takes about 5.6 GB in .venv, the CPU build 1.2 GB; the build folder and
# the tests need a few GB more. A disk that cannot hold the CUDA build gets the CPU one (the
# CPU tests run the same; only the CUDA code goes uncompiled), said aloud.
free_gib() { df -Pk "$1" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
cuda_torch_min_free_gib=10
# The local version label matters: PyPI's Linux wheels of torch are CUDA builds, and a CUDA
# build's CMake package needs a CUDA toolkit, so plain torch==2.13.0 would leave a machine
# without nvcc unable to configure. The +cpu builds are on PyTorch's own index.
cpu_torch=torch==2.13.0+cpu
cpu_torch_index=https://download.pytorch.org/whl/cpu
if [[ -n ${TIDE_TORCH:-} ]]; then
  torch_spec=$TIDE_TORCH
elif cuda_toolkit; then
  torch_spec=torch==2.14.1
  free=$(free_gib "$root")
  if [[ ! -x $venv/bin/python ]] && ((free < cuda_torch_min_free_gib)); then
    if ((cuda)); then
      echo "setup: $free GiB free on the disk of $root; the CUDA build of torch needs" \
           "$cuda_torch_min_free_gib GiB (free some space, or set TIDE_TORCH)" >&2
      exit 1
    fi
    echo "setup: warning: only $free GiB free on the disk of $root, under the" \
         "$cuda_torch_min_free_gib GiB the CUDA build of torch needs: installing the CPU build" \
         "$cpu_torch instead (the CUDA code will not be compiled)" >&2
    torch_spec=$cpu_torch
  fi
else
  torch_spec=$cpu_torch
fi
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
# Its temporary files go beside .venv, on the disk that must hold the result anyway, not in
# a /tmp that may be a small tmpfs.
pip_install() {
  mkdir -p "$venv/pip-tmp"
  TMPDIR=$venv/pip-tmp "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing $torch_spec into .venv"
  if [[ $torch_spec == *+cpu ]] && ! "$venv/bin/pip" download --quiet --no-index --no-deps \
       --dest "$venv/pip-tmp/probe" "$torch_spec" 2>/dev/null; then
    # Not among pip's configured local wheels (as on machines that keep one on disk).
    pip_install "$torch_spec" --extra-index-url "$cpu_torch_index" || {
      echo "setup: could not install $torch_spec from $cpu_torch_index; set TIDE_TORCH to another" \
           "torch requirement or a wheel's path (docs/building.md)" >&2
      exit 1
    }
  else
    pip_install "$torch_spec"
  fi
  rm -rf "$venv/pip-tmp/probe"
fi
if ((cuda)) && ! "$venv/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
  echo "setup: .venv holds a CPU build of torch; the GPU commands need a CUDA one" \
       "(remove .venv; setup then takes python3's CUDA torch, or torch==2.14.1 where nvcc is installed," \
       "or TIDE_TORCH)" >&2
  exit 1
fi
# Quick and offline when every pinned version is already there.
pip_install -r "$root/scripts/python-requirements.txt"
