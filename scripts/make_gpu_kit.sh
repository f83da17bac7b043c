#!/usr/bin/env bash
# Makes the kit that a GPU host with no package registry builds tide with (docs/gpu.md,
# "A lease of a GPU machine"): the Debian 12 packages tide builds against, unpacked there
# by ../shared/gpu/build-on-gpu-host.sh, that script itself, and the Python wheels the
# host's Python 3.12 lacks. scripts/gpu_host_checks.sh --kit DIR uses it.
# Usage: scripts/make_gpu_kit.sh [DIR]   (default .gpu, which git ignores)
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
cd "$(dirname "$0")/.."
kit=${1:-.gpu}
shared=../shared/gpu
if [[ ! -x $shared/fetch-debs.sh || ! -x $shared/build-on-gpu-host.sh ]]; then
  echo "make_gpu_kit: no $shared/fetch-debs.sh and build-on-gpu-host.sh (the shared GPU scripts)" >&2
  exit 2
fi
if [[ ! -x .venv/bin/pip ]]; then
  echo "make_gpu_kit: no .venv (scripts/setup.sh makes it); its pip fetches the wheels" >&2
  exit 2
fi
# fetch-debs.sh changes into DIR/debs and then DIR/fallback: DIR must be absolute.
"$shared/fetch-debs.sh" "$(realpath -m "$kit/kit")" > /dev/null
cp "$shared"/*.sh "$kit/kit/"
# What tide needs beyond the shared list: Gloo's headers (c10d's Gloo backend), cereal,
# cpp-httplib with the TLS and compression libraries its .pc file names, prometheus-cpp.
(cd "$kit/kit/debs" && apt-get download -q libgloo-dev libcereal-dev libcpp-httplib-dev libcpp-httplib0.11 \
  prometheus-cpp-dev libprometheus-cpp-core1.0 libssl-dev zlib1g-dev libbrotli-dev libbrotli1 > /dev/null)
# OpenSSL's runtime, where the host has none (build-on-gpu-host.sh takes fallbacks only then).
(cd "$kit/kit/fallback" && apt-get download -q libssl3 > /dev/null)
# daemon.cuda's client speaks ZeroMQ from the host's Python.
mkdir -p "$kit/whl"
.venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d "$kit/whl" pyzmq==27.3.0 \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "make_gpu_kit: $kit ($(du -sh "$kit" | cut -f1)); carry [\"$kit\", \"data\", \"ipc/web/node_modules\"]"
