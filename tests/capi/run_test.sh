#!/bin/sh
# The C API end to end: run.c against an embedded engine, then against a tided process.
# With "cuda" (PYTHON: one whose torch is the LibTorch tide links): the embedded engine's
# run on a GPU, skipped where none is present (tests/tools/cuda_probe.py).
# Usage: run_test.sh RUN_BINARY TIDE TIDED [cuda PYTHON]
set -eu
RUN=$1 TIDE=$2 TIDED=$3 MODE=${4:-cpu}
WORKER="$(dirname "$TIDE")/tide-worker"  # what the engines start for each rank
if [ "$MODE" = cuda ]; then
  "$5" "$(dirname "$0")/../tools/cuda_probe.py" || exit $?
fi
WORK=$(mktemp -d /tmp/tide-capi-XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
"$TIDE" data prepare /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 --out "$WORK/ds" \
  --tokenizer bytes --val-fraction 0.1 2>/dev/null
if [ "$MODE" = cuda ]; then
  TIDE_TEST_DEVICE=cuda "$RUN" embedded "$WORK/embedded" "$WORKER" "$WORK" "$(dirname "$0")/tiny.lua"
  exit 0
fi
"$RUN" embedded "$WORK/embedded" "$WORKER" "$WORK" "$(dirname "$0")/tiny.lua"
"$TIDED" --foreground --state-dir "$WORK/daemon" --cpu-slots 2 --no-tcp --worker "$WORKER" 2>"$WORK/tided.log" &
DAEMON=$!
i=0
until [ -f "$WORK/daemon/endpoints.json" ]; do
  i=$((i + 1)); [ $i -lt 300 ] || { cat "$WORK/tided.log"; exit 1; }; sleep 0.1
done
"$RUN" connect "ipc://$WORK/daemon/command.sock" "$WORK" "$(dirname "$0")/tiny.lua"
