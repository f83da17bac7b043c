#!/usr/bin/env bash
# The format and tidy checks of `make test` (the lint.changed_lines test): clang-format
# (.clang-format) and clang-tidy (.clang-tidy) on the C and C++ lines changed since
# $TIDE_LINT_BASE (default HEAD~1: the commit being landed; a clone without that commit
# has nothing to compare and passes). Only changed lines are held to them: the tree was
# written before the files existed, and a change should not inherit its neighbours' debts.
#
# Usage: scripts/lint.sh [BUILD_DIR]   (BUILD_DIR holds compile_commands.json; default build)
set -euo pipefail
if [[ ${1:-} == --help || ${1:-} == -h ]]; then sed -n 2,9p "$0"; exit 0; fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
base=${TIDE_LINT_BASE:-HEAD~1}
cd "$root"
for tool in clang-format-14 clang-format-diff-14 clang-tidy-14 clang-tidy-diff-14.py; do
  command -v "$tool" >/dev/null || { echo "lint: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "lint: no commit $base to compare with; nothing to check"
  exit 0
fi
paths=(engine ipc scripting capi tools worker tests bench examples)
status=0

# The changed lines, a moved file's unchanged ones not among them (-M).
changes=$(git diff -U0 -M --no-color "$base" -- "${paths[@]}")
# clang-format-diff formats only those lines and prints what it would change.
format=$(clang-format-diff-14 -p1 -binary clang-format-14 -iregex '.*\.(c|cpp|h)' <<<"$changes" || true)
if grep -q '^[-+]' <<<"$format"; then
  echo "lint: lines changed since $base are not formatted as .clang-format says:" >&2
  echo "$format" >&2
  echo "lint: git diff -U0 -M $base | clang-format-diff-14 -p1 -i fixes them" >&2
  status=1
fi

# clang 14 cannot parse GCC 13's C++20 standard library (<chrono>, Ubuntu 24.04's), which
# LibTorch 2.x's headers require: there only clang-format runs; CI's GCC 12 runs both.
cxx=$(sed -n 's/^set(CMAKE_CXX_COMPILER_\(ID\|VERSION\) "\(.*\)")$/\2/p' "$build"/CMakeFiles/*/CMakeCXXCompiler.cmake |
  paste -sd ' ')
checked="clang-format and clang-tidy"
if [[ $cxx =~ ^GNU\ ([0-9]+) ]] && ((BASH_REMATCH[1] >= 13)); then
  echo "lint: clang-tidy skipped: clang 14 cannot read the C++20 library of GCC ${cxx#GNU } (CI's GCC 12 runs it)"
  checked="clang-format"
else
  # clang-tidy-diff reports on changed lines of the sources in compile_commands.json: the
  # build's, and the fuzz build's (tests/fuzz, made by the fuzz.inputs test) where it
  # exists. The build's precompiled headers are GCC's, which clang cannot read: clang-tidy
  # gets copies of the prefix headers without them. A changed source in neither database
  # (a fuzz target before its build) is left to the format check.
  db=$(mktemp -d)
  trap 'rm -rf "$db"' EXIT
  changes=$(python3 /dev/fd/3 "$db" "$root" "$build/compile_commands.json" "$build/fuzz/compile_commands.json" \
    <<<"$changes" 3<<'PY'
import json, os, re, shutil, sys
out, root = sys.argv[1], sys.argv[2]
entries = []
for path in sys.argv[3:]:
    if os.path.exists(path):
        entries += json.load(open(path))
# A unity batch (cmake/UnityBuild.cmake) is one entry: each source it includes gets the
# batch's command, so that clang-tidy reads it alone.
for e in list(entries):
    if re.search(r"/Unity/unity_\d+_cxx\.cxx$", e["file"]):
        for source in re.findall(r'^#include "(.*)"$', open(e["file"]).read(), re.M):
            entries.append(dict(e, file=source, command=e["command"].replace(e["file"], source)))
known = {os.path.relpath(os.path.realpath(e["file"]), root) for e in entries}
for e in entries:
    words = e["command"].split(" ")
    for i, w in enumerate(words):
        if w.endswith("cmake_pch.hxx") and i > 0 and words[i - 1] == "-include":
            copy = os.path.join(out, w.strip("/").replace("/", "_"))
            if not os.path.exists(copy):
                shutil.copyfile(w, copy)
            words[i] = copy
    e["command"] = " ".join(words)
json.dump(entries, open(os.path.join(out, "compile_commands.json"), "w"))
# The diff on stdin, less the files no database compiles.
keep = True
for line in sys.stdin.read().splitlines():
    if line.startswith("diff --git"):
        keep = True
    m = re.match(r"\+\+\+ b/(.*)", line)
    if m and m.group(1).endswith((".c", ".cpp")) and m.group(1) not in known:
        keep = False
    if keep:
        print(line)
PY
)
  tidy=$(clang-tidy-diff-14.py -clang-tidy-binary clang-tidy-14 -p1 -path "$db" -quiet -j "$(nproc)" \
    -iregex '.*\.(c|cpp)' -extra-arg=-Wno-unknown-warning-option 2>&1 <<<"$changes" || true)
  if grep -qE '(warning|error): |^Failed: ' <<<"$tidy"; then
    echo "lint: clang-tidy on lines changed since $base:" >&2
    grep -E -A3 '(warning|error): |^Failed: ' <<<"$tidy" >&2
    status=1
  fi
fi
((status == 0)) && echo "lint: lines changed since $base pass $checked"
exit $status
