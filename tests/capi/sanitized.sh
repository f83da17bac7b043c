#!/bin/sh
# Builds the C API, tided and the C tests with AddressSanitizer and UBSan (a build without
# LibTorch: TIDE_CAPI_ONLY) and runs the C API tests there. Any report fails the test.
# Usage: sanitized.sh SOURCE_DIR BUILD_DIR TIDE_WORKER
set -eu
SRC=$1 BUILD=$2 WORKER=$3
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DTIDE_CAPI_ONLY=ON -DTIDE_SANITIZE=ON \
  -DTIDE_WERROR=ON -DTIDE_TEST_WORKER="$WORKER" > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target capi_misuse capi_run tided tide_capi
export ASAN_OPTIONS=abort_on_error=0:halt_on_error=1:detect_leaks=1:exitcode=86
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$BUILD" && ctest --output-on-failure -R 'capi\.(misuse|run)$'
