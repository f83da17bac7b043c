#!/usr/bin/env bash
# A run refuses to start where std::filesystem resolves outside libstdc++
# (check_std_library_binding; cmake/Linking.cmake): FAKE_LIB, preloaded, defines
# std::filesystem::remove_all first, as PyTorch 2.11's libtorch did on a GPU host. (Every
# other run of the suite is the case where it starts.)
set -euo pipefail
tide=$1
fake=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run=(train llama/llama-tiny --set schedule.steps=1 --set schedule.warmup_steps=0 --set eval.every=0)

rc=0
LD_PRELOAD=$fake "$tide" "${run[@]}" --run-dir "$work/refused" 2> "$work/err.txt" || rc=$?
[[ $rc -eq 1 ]] || { cat "$work/err.txt"; fail "tide exited $rc beside a std::filesystem of $fake (want 1)"; }
grep -q "std::filesystem::remove_all resolves to $fake instead of libstdc++" "$work/err.txt" ||
  { cat "$work/err.txt"; fail "the error does not name $fake"; }
grep -q "Until it is relinked, LD_PRELOAD=/.*/libstdc++.so.6[.0-9]* puts libstdc++ first" "$work/err.txt" ||
  { cat "$work/err.txt"; fail "the error does not give the loaded libstdc++ as the way round it"; }
[[ ! -e $work/refused/checkpoints ]] || fail "the refused run wrote checkpoints"

echo "std binding guard: ok"
