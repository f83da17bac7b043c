#!/bin/sh
# The C API end to end: run.c against an embedded engine, then against a tided process.
# Usage: run_test.sh RUN_BINARY TIDE TIDED
set -eu
RUN=$1 TIDE=$2 TIDED=$3
WORK=$(mktemp -d /tmp/tide-capi-XXXXXX)
DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
"$TIDE" data prepare /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 --out "$WORK/ds" \
  --tokenizer bytes --val-fraction 0.1 2>/dev/null
cat > "$WORK/tiny.lua" <<'LUA'
return tide.recipe {
  name = "capi", seed = 7, threads = 1,
  model = tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2,
                              multiple_of = 32, max_seq_len = 64 },
  data = { path = "ds", seq_len = 64 },
  batch = { micro_batch = 2, global_batch = 8 },
  optimizer = { lr = 1e-3 },
  schedule = { steps = 100000, warmup_steps = 2, decay = "constant" },
  checkpoint = { every = 0, keep_last = 3 },
  eval = { every = 0 },
  log_every = 1000,
}
LUA
"$RUN" embedded "$WORK/embedded" "$TIDE" "$WORK" "$WORK/tiny.lua"
"$TIDED" --foreground --state-dir "$WORK/daemon" --cpu-slots 2 --no-tcp --worker "$TIDE" 2>"$WORK/tided.log" &
DAEMON=$!
i=0
until [ -f "$WORK/daemon/endpoints.json" ]; do
  i=$((i + 1)); [ $i -lt 300 ] || { cat "$WORK/tided.log"; exit 1; }; sleep 0.1
done
"$RUN" connect "ipc://$WORK/daemon/command.sock" "$WORK" "$WORK/tiny.lua"
