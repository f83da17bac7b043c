#!/bin/sh
# Builds the C API, tided and the C tests with AddressSanitizer and UBSan in the sanitized
# tree (tests/sanitized_tree.sh: no LibTorch) and runs the C API tests there. Any report
# fails the test.
# Usage: sanitized.sh SOURCE_DIR BUILD_DIR TIDE_WORKER
set -eu
SRC=$1 BUILD=$2 WORKER=$3
sh "$SRC/tests/sanitized_tree.sh" "$SRC" "$BUILD" "$WORKER" capi_misuse capi_run tided tide_capi
export ASAN_OPTIONS=abort_on_error=0:halt_on_error=1:detect_leaks=1:exitcode=86
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$BUILD" && ctest --output-on-failure -R 'capi\.(misuse|run)$'
