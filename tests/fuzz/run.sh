#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in the sanitized tree (tests/sanitized_tree.sh:
# Clang, AddressSanitizer and UBSan, no LibTorch; capi.sanitized shares it) and runs each
# from seeds that the real producers of those files make (make_seeds.py), a fixed number
# of inputs with a fixed seed, two at a time. A crash, a leak, a sanitizer report, an input
# that takes over 20 s or a fault a target asserts fails the test; the input is kept under
# BUILD_DIR/findings.
# Usage: run.sh SOURCE_DIR BUILD_DIR TIDE PYTHON [RUNS]
set -eu
SRC=$1 BUILD=$2 TIDE=$3 PYTHON=$4 RUNS=${5:-20000}
# fuzz_http (below) mostly waits; the others keep a core busy each and run two at a time,
# the longest first (seconds on a 2-core EPYC: 50, 37, 8, 8, 7, 3, 2 and http's 61): all in
# about a minute, where fixed pairs took 155 s.
TARGETS="checkpoint controller recipe token_dataset tokenizer fine_tuning_examples request safetensors"

sh "$SRC/tests/sanitized_tree.sh" "$SRC" "$BUILD" "$TIDE" $(for t in http $TARGETS; do printf 'fuzz_%s ' "$t"; done)

rm -rf "$BUILD/seeds" "$BUILD/corpus" "$BUILD/findings" "$BUILD/logs"
mkdir -p "$BUILD/findings" "$BUILD/logs"
"$PYTHON" "$SRC/tests/fuzz/make_seeds.py" "$BUILD/seeds" "$TIDE" "$SRC"

# The targets' scratch files, in memory where there is a /dev/shm (thousands a second).
TIDE_FUZZ_DIR=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/tide-fuzz-run-XXXXXX")
export TIDE_FUZZ_DIR
trap 'rm -rf "$TIDE_FUZZ_DIR"' EXIT
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz_one() {
  t=$1
  runs=$RUNS
  # The controller target starts a controller for each input (about 100 a second, not
  # thousands): a tenth of the count keeps its time near the others'.
  [ "$t" = controller ] && runs=$((RUNS / 10))
  # The HTTP target waits for each answer to go quiet (fuzz_http.cpp): about 20 inputs a
  # second, nearly all of it idle.
  [ "$t" = http ] && runs=$((RUNS / 20))
  mkdir -p "$BUILD/corpus/$t"
  # -malloc_limit_mb: one allocation an input asks for beyond this is a finding (a length
  # field believed); -rss_limit_mb bounds the process. -handle_term=0: a worker the
  # controller target forks and ends before its exec dies of the SIGTERM, rather than
  # running the fuzzer's exit handlers (which remove the target's files) in the child.
  if "$BUILD/tests/fuzz/fuzz_$t" -runs="$runs" -seed=1 -max_total_time=300 -timeout=20 -rss_limit_mb=2048 \
       -handle_term=0 \
       -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$BUILD/findings/$t-" \
       "$BUILD/corpus/$t" "$BUILD/seeds/$t" > "$BUILD/logs/$t.log" 2>&1; then
    echo "fuzz_$t: $(grep -m1 'stat::number_of_executed_units' "$BUILD/logs/$t.log" | awk '{print $2}') inputs," \
         "$(grep -m1 'stat::peak_rss_mb' "$BUILD/logs/$t.log" | awk '{print $2}') MB peak, no finding"
  else
    touch "$BUILD/logs/$t.failed"
    echo "fuzz_$t: FINDING" >&2
    grep -E -A40 'ERROR|tide fuzz fault|what\(\)' "$BUILD/logs/$t.log" | head -60 >&2
    for f in "$BUILD/findings/$t-"*; do
      [ -e "$f" ] && echo "reproduce: $BUILD/tests/fuzz/fuzz_$t $f" >&2
    done
    return 1
  fi
}

fuzz_one http &
http=$!
busy=0
for t in $TARGETS; do
  while [ $busy -eq 2 ]; do
    wait -n -p ended || true  # a target's failure is its .failed file
    [ "$ended" = "$http" ] || busy=$((busy - 1))
  done
  fuzz_one "$t" &
  busy=$((busy + 1))
done
wait
! ls "$BUILD/logs/"*.failed > /dev/null 2>&1
