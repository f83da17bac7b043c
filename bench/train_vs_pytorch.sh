#!/usr/bin/env bash
# make bench: tide vs PyTorch eager training throughput (see train_vs_pytorch.py).
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/train_vs_pytorch.py --tide "$build/tools/tide" "${@:2}"
