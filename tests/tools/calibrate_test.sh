#!/usr/bin/env bash
# `tide plan --calibrate` stores this CPU's figures where `tide plan` and parallel.auto read
# them (XDG_CACHE_HOME/tide/calibration-cpu.json), for one thread a rank and for all the
# cores. The tests that plan for this CPU share the file it leaves (ctest fixture
# cpu_calibration): a calibration takes one to two minutes on two cores.
# Usage: calibrate_test.sh TIDE CACHE_DIR
set -euo pipefail
tide=$1 cache=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$cache"
mkdir -p "$cache"
out=$(XDG_CACHE_HOME=$cache $tide plan --calibrate 2>&1) || { echo "$out"; fail "tide plan --calibrate"; }
echo "$out"
file=$cache/tide/calibration-cpu.json
test -s "$file" || fail "no calibration stored in $file"
grep -q "stored in $file" <<<"$out" || fail "the calibration does not say where it is stored"
cores=$(nproc)
python3 - "$file" "$cores" <<'PY' || fail "the stored calibration is not the documented shape"
import json, sys
c = json.load(open(sys.argv[1]))
cores = int(sys.argv[2])
assert c["schema"] == "tide.calibration/1" and c["cores"] == cores, c.keys()
for threads in {1, cores}:
    d = c["by_threads"][str(threads)]
    assert d["calibrated"] and d["fp32_flops"] > 0 and d["memory_bandwidth"] > 0, d
PY
echo "calibration: ok"
