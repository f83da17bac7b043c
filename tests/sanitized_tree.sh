#!/bin/sh
# Configures and builds TARGETS in the sanitized tree that capi.sanitized and fuzz.inputs
# share: Clang 14, no LibTorch (TIDE_CAPI_ONLY), AddressSanitizer and UBSan, libFuzzer's
# coverage (TIDE_FUZZ). Both tests configure it with these same options, so whichever runs
# second builds only its own targets. The configure and build logs are BUILD_DIR.*.log.
# Usage: sanitized_tree.sh SOURCE_DIR BUILD_DIR TIDE TARGET...
set -eu
SRC=$1 BUILD=$2 TIDE=$3
shift 3
# The Clang that scripts/setup.sh installs beside clang-tidy, with its libFuzzer runtime.
CXX=$(command -v clang++-14 || command -v clang++ || true)
CC=$(command -v clang-14 || command -v clang || true)
[ -n "$CXX" ] && [ -n "$CC" ] || { echo "sanitized_tree.sh: no clang++ (scripts/setup.sh installs clang-14)" >&2; exit 1; }
# Ninja where it is installed, as the Makefile does; a tree keeps its first generator.
GENERATOR=""
if command -v ninja >/dev/null && [ ! -f "$BUILD/CMakeCache.txt" ]; then GENERATOR="-G Ninja"; fi
# Line tables only: what a sanitizer's report and a fuzzer's stack need (file and line of
# each frame); the tree compiles in 95% of the CPU time full debug information took.
DEBUG_FLAGS="-O2 -gline-tables-only -DNDEBUG"
cmake -S "$SRC" -B "$BUILD" $GENERATOR -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$DEBUG_FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$DEBUG_FLAGS" \
  -DTIDE_CAPI_ONLY=ON -DTIDE_SANITIZE=ON -DTIDE_FUZZ=ON -DTIDE_TEST_WORKER="$TIDE" > "$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target "$@" > "$BUILD.build.log" 2>&1 ||
  { tail -50 "$BUILD.build.log" >&2; echo "sanitized_tree.sh: the build failed (libclang-rt-14-dev has libFuzzer)" >&2; exit 1; }
