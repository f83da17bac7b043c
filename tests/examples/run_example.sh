#!/bin/sh
# Runs one language's example (examples/README.md) on a small prepared dataset and checks
# that it trained to the end, changed the lr and checkpointed on the way.
# Usage: run_example.sh c|python|go|rust SOURCE_DIR TIDE LIBTIDE [C_EXAMPLE]
set -eu
LANG_=$1 SRC=$2 TIDE=$3 LIB=$4 C_EXAMPLE=${5:-}
WORK=$(mktemp -d /tmp/tide-example-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$TIDE" data prepare /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 \
  /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/MPL-2.0 --out "$WORK/ds" --tokenizer bytes \
  --val-fraction 0.05 2>/dev/null
export TIDE_EXAMPLE_DATA="$WORK/ds" TIDE_STATE_DIR="$WORK/state" TIDE_WORKER="$(dirname "$TIDE")/tide-worker" TIDE_LIBRARY="$LIB"
LIBDIR=$(dirname "$LIB")
case $LANG_ in
  c) "$C_EXAMPLE" > "$WORK/out" ;;
  python) python3 "$SRC/examples/python/train_tiny.py" > "$WORK/out" ;;
  go) (cd "$SRC/examples/go" && CGO_LDFLAGS="-L$LIBDIR -Wl,-rpath,$LIBDIR" GOPROXY=off GOFLAGS=-mod=mod go run .) > "$WORK/out" ;;
  rust)
    CARGO=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
    (cd "$SRC/examples/rust" && TIDE_LIB_DIR="$LIBDIR" CARGO_TARGET_DIR="$LIBDIR/../rust-examples" \
      "$CARGO" run --offline --quiet) > "$WORK/out" ;;
  *) echo "unknown example language '$LANG_'" >&2; exit 2 ;;
esac
cat "$WORK/out"
grep -q "optimizer.lr set to 1e-3" "$WORK/out"
grep -q "checkpoint requested" "$WORK/out"
grep -q "completed after 30 steps" "$WORK/out"
