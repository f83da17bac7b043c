#!/usr/bin/env bash
# The tide CLI as a user drives it: real processes, real files, exit codes, stderr.
set -euo pipefail
tide=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Every command has --help.
for cmd in "" train eval generate "data" "data prepare" "recipe" "recipe show" "recipe check" "recipe fields" \
           "convert" "convert export" "convert import" "ckpt" "ckpt list" "ckpt verify" "ckpt inspect" "ckpt export" \
           "dashboard" "plan"; do
  $tide $cmd --help > "$work/help.txt" || fail "tide $cmd --help exited non-zero"
  grep -qi "usage" "$work/help.txt" || fail "tide $cmd --help printed no usage"
done

# Bad input: a clear error on stderr, non-zero exit.
cat > "$work/bad.lua" <<'LUA'
return tide.recipe {
  model = tide.models.llama { dim = 64, n_heads = 5 },
}
LUA
if $tide recipe check "$work/bad.lua" 2> "$work/err.txt"; then fail "a broken recipe passed"; fi
grep -q "bad.lua:2: model.n_heads: 5 does not divide model.dim = 64" "$work/err.txt" || { cat "$work/err.txt"; fail "error lacks file:line"; }
if $tide train "$work/nothing.lua" 2> "$work/err.txt"; then fail "a missing recipe trained"; fi
grep -q "nothing.lua" "$work/err.txt" || fail "missing recipe not named"

# tide plan: the ranking for a described cluster, as text and as JSON; refusals.
$tide plan "$src/recipes/llama/llama-2-70b.lua" --nodes 4 --gpus-per-node 8 --device h100-80 > "$work/plan.txt"
grep -q "layouts fit; the best 10" "$work/plan.txt" || { cat "$work/plan.txt"; fail "tide plan printed no ranking"; }
grep -q "memory per rank" "$work/plan.txt" || fail "tide plan did not itemise memory"
$tide plan llama/llama-2-70b --nodes 4 --gpus-per-node 8 --device h100-80 --json --top 3 > "$work/plan.json"
python3 - "$work/plan.json" <<'PY' || fail "tide plan --json is not the documented shape"
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["schema"] == "tide.plan/1" and len(plan["ranked"]) == 3, plan.keys()
best = plan["ranked"][0]
assert best["fits"] and best["memory"]["device"] <= plan["cluster"]["device"]["memory_bytes"], best
assert best["layout"]["dp"] * best["layout"]["tp"] * best["layout"]["pp"] == 32, best["layout"]
PY
if $tide plan llama/llama-tiny --device tpu-v9 2> "$work/err.txt"; then fail "an unknown device was planned for"; fi
grep -q "unknown device 'tpu-v9'" "$work/err.txt" || { cat "$work/err.txt"; fail "unknown device not named"; }
if $tide plan llama/llama-2-70b --device l40s --gpus-per-node 2 --no-offload > "$work/none.txt" 2> "$work/err.txt"; then
  fail "70B on two L40S was planned as fitting"
fi
grep -q "no layout fits" "$work/none.txt" || { cat "$work/none.txt"; fail "tide plan did not say nothing fits"; }

# Data → train → generate → eval → export → import, on real text.
cp /usr/share/common-licenses/GPL-3 "$work/gpl.txt"
$tide data prepare "$work/gpl.txt" --out "$work/ds" --vocab-size 512 --val-fraction 0.1 2> "$work/prep.txt"
test -s "$work/ds/train.bin" || fail "no train.bin"
cat > "$work/tiny.lua" <<LUA
return tide.recipe {
  name = "cli-tiny",
  model = tide.models.llama { vocab_size = 512, dim = 32, n_layers = 1, n_heads = 2, max_seq_len = 64, multiple_of = 16 },
  data = { path = "$work/ds", seq_len = 32 },
  batch = { micro_batch = 4, global_batch = 4 },
  optimizer = { lr = 3e-3 },
  schedule = { steps = 4, warmup_steps = 1, lr = function(step) return 1e-3 end },
  eval = { every = 2, batches = 2 },
  threads = 1,
}
LUA
$tide recipe show "$work/tiny.lua" --set optimizer.weight_decay=0.05 > "$work/show.json"
grep -q '"weight_decay": 0.05' "$work/show.json" || fail "override not shown"
$tide train "$work/tiny.lua" --run-dir "$work/run" --peak-tflops 0.1 2> "$work/train.txt" || { cat "$work/train.txt"; fail "train failed"; }
grep -q "step 4/4" "$work/train.txt" || fail "no progress line"
test "$(wc -l < "$work/run/metrics.jsonl")" -eq 4 || fail "metrics.jsonl should hold 4 steps"
grep -q '"lr":0.001' "$work/run/metrics.jsonl" || fail "the Lua schedule did not set the lr"
$tide generate "$work/run" --prompt "GNU" --max-tokens 10 --seed 1 > "$work/gen.txt"
grep -q "^GNU" "$work/gen.txt" || fail "generate did not echo the prompt"
# A model 4 steps old picks bytes that form no character: they print as U+FFFD.
$tide generate "$work/run" --max-tokens 300 --seed 2 > "$work/gen-long.txt"
python3 - "$work/gen-long.txt" <<'PY' || fail "generate printed bytes that are not UTF-8"
import sys
text = open(sys.argv[1], encoding="utf-8", errors="strict").read()
print(f"  tide generate: {len(text)} characters of valid UTF-8, {text.count(chr(0xFFFD))} replaced")
PY
$tide eval "$work/run" --data "$work/ds" --seq-len 32 --batches 2 > "$work/eval.json"
grep -q '"perplexity"' "$work/eval.json" || fail "eval printed no perplexity"
# As a run with data.eod_mask_loss measures: the windows' document ends left out.
$tide eval "$work/run" --data "$work/ds" --seq-len 32 --batches 8 > "$work/eval8.json"
$tide eval "$work/run" --data "$work/ds" --seq-len 32 --batches 8 --eod-mask-loss > "$work/eval-eod.json"
python3 - "$work/eval8.json" "$work/eval-eod.json" <<'PY' || fail "tide eval --eod-mask-loss measured every target"
import json, math, sys
every, masked = (json.load(open(f))["loss"] for f in sys.argv[1:3])
assert math.isfinite(masked) and masked != every, (every, masked)
print(f"  tide eval: {every:.6f}, with document ends left out {masked:.6f}")
PY
# Fine-tuning data: prompt-completion JSON lines, each example's prompt left out of the
# loss; trained from whole examples, measured as such a run measures.
python3 - "$work/sft.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(200):
        f.write(json.dumps({"prompt": f"Question {i}: what may I do with it?\n",
                            "completion": f"Answer {i}: share and change it, under the same terms."}) + "\n")
PY
$tide data prepare "$work/sft.jsonl" --format prompt-completion --tokenizer "$work/ds/tokenizer.json" --out "$work/sft" \
  2> "$work/prep-sft.txt" || { cat "$work/prep-sft.txt"; fail "data prepare --format prompt-completion failed"; }
test -s "$work/sft/train.mask" || fail "no train.mask"
grep -q '"loss_mask": true' "$work/sft/dataset.json" || fail "dataset.json does not say it has a loss mask"
$tide train "$work/tiny.lua" --run-dir "$work/sft-run" --set "data.path=$work/sft" --set data.loss_mask=true \
  --set data.document_windows=true 2> "$work/sft-train.txt" || { cat "$work/sft-train.txt"; fail "a loss-masked run failed"; }
$tide eval "$work/sft-run" --data "$work/sft" --seq-len 32 --batches 4 > "$work/sft-eval.json"
$tide eval "$work/sft-run" --data "$work/sft" --seq-len 32 --batches 4 --loss-mask --document-windows \
  > "$work/sft-eval-masked.json"
python3 - "$work/sft-eval.json" "$work/sft-eval-masked.json" <<'PY' || fail "tide eval --loss-mask measured every target"
import json, math, sys
every, masked = (json.load(open(f))["loss"] for f in sys.argv[1:3])
assert math.isfinite(masked) and masked != every, (every, masked)
print(f"  tide eval: {every:.6f}, the completions alone {masked:.6f}")
PY
if $tide train "$work/tiny.lua" --run-dir "$work/no-mask" --set data.loss_mask=true 2> "$work/err.txt"; then
  fail "data.loss_mask trained on a dataset without a loss mask"
fi
grep -q "data.path: .*has no loss mask" "$work/err.txt" || { cat "$work/err.txt"; fail "the missing loss mask not named"; }
if $tide eval "$work/run" --data "$work/ds" --loss-mask 2> "$work/err.txt"; then fail "eval --loss-mask took a dataset without one"; fi
grep -q "has no loss mask" "$work/err.txt" || { cat "$work/err.txt"; fail "eval did not name the missing loss mask"; }
printf '{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n' > "$work/bad.jsonl"
if $tide data prepare "$work/bad.jsonl" --format prompt-completion --tokenizer bytes --out "$work/bad-ds" 2> "$work/err.txt"; then
  fail "an example without a completion was prepared"
fi
grep -q 'bad.jsonl:2: no "completion"' "$work/err.txt" || { cat "$work/err.txt"; fail "the bad line was not named"; }
test ! -e "$work/bad-ds" || fail "a failed prepare left a dataset"
# Conversations: the chat template's markup and the user's turns left out of the loss; the
# exported model carries its template, and transformers prompts it in that format.
python3 - "$work/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(150):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}: may I share it?"},
                                         {"role": "assistant", "content": f"Answer {i}: yes, under the same terms."},
                                         {"role": "user", "content": "And change it?"},
                                         {"role": "assistant", "content": "Yes."}]}) + "\n")
PY
if $tide data prepare "$work/chat.jsonl" --format messages --tokenizer "$work/ds/tokenizer.json" --out "$work/chat" \
  2> "$work/err.txt"; then fail "a tokenizer without any chat template's tokens prepared conversations"; fi
grep -q "has the special tokens of no chat template" "$work/err.txt" || { cat "$work/err.txt"; fail "no chat template named"; }
$tide data prepare "$work/chat.jsonl" --format messages --chat-template chatml --vocab-size 512 --out "$work/chat" \
  2> "$work/prep-chat.txt" || { cat "$work/prep-chat.txt"; fail "data prepare --format messages failed"; }
grep -q '"chat_template": "chatml"' "$work/chat/dataset.json" || fail "dataset.json does not name its chat template"
test -s "$work/chat/chat_template.jinja" || fail "no chat_template.jinja beside the tokenizer"
chat_vocab=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$work/chat/dataset.json")
$tide train "$work/tiny.lua" --run-dir "$work/chat-run" --set "data.path=$work/chat" --set data.loss_mask=true \
  --set data.document_windows=true --set "model.vocab_size=$chat_vocab" 2> "$work/chat-train.txt" \
  || { cat "$work/chat-train.txt"; fail "a run on conversations failed"; }
$tide convert export "$work/chat-run" --out "$work/chat-hf" 2> /dev/null
cmp -s "$work/chat/chat_template.jinja" "$work/chat-hf/chat_template.jinja" || fail "the export lacks the chat template"
"${TIDE_PYTHON:-python3}" - "$work/chat-hf" "$work/chat" <<'PY' || fail "transformers did not prompt the export in its template"
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
assert json.load(open(sys.argv[1] + "/tokenizer_config.json"))["chat_template"] == tok.chat_template
ids = tok.apply_chat_template([{"role": "user", "content": "Question 0: may I share it?"}],
                              add_generation_prompt=True, tokenize=True)
text = tok.decode(ids)
assert text == "<|im_start|>user\nQuestion 0: may I share it?<|im_end|>\n<|im_start|>assistant\n", text
# The run's data starts with those ids: the model was tuned on what the template writes.
meta = json.load(open(sys.argv[2] + "/dataset.json"))
import numpy
train = numpy.memmap(sys.argv[2] + "/train.bin", dtype="<u2" if meta["dtype"] == "uint16" else "<u4", mode="r")
assert list(train[:len(ids)]) == ids, (list(train[:len(ids)]), ids)
print(f"  export prompts in chatml: {len(ids)} ids, as the training data begins")
PY
# tide generate --chat: the user's message in the run's template, the reply up to the end
# of the assistant's turn: greedy, it is what the same prompt written out continues with.
$tide generate "$work/chat-run" --chat "Question 7: may I share it?" --temperature 0 --max-tokens 24 \
  > "$work/chat-reply.txt" || fail "generate --chat failed"
written=$(printf '<|im_start|>user\nQuestion 7: may I share it?<|im_end|>\n<|im_start|>assistant\n.')
$tide generate "$work/chat-run" --temperature 0 --max-tokens 24 --prompt "${written%.}" \
  > "$work/chat-prompt.txt" || fail "generate --prompt with the template written out failed"
python3 - "$work/chat-reply.txt" "$work/chat-prompt.txt" <<'PY' || fail "generate --chat is not the template's prompt continued"
import sys
reply = open(sys.argv[1]).read().rstrip("\n")
written = open(sys.argv[2]).read()
prompt = "<|im_start|>user\nQuestion 7: may I share it?<|im_end|>\n<|im_start|>assistant\n"
assert written.startswith(prompt + reply), (reply, written)
assert "<|im_end|>" not in reply and "<|im_start|>" not in reply, reply
print(f"  generate --chat: {len(reply)} characters, the written-out prompt's continuation")
PY
if $tide generate "$work/run" --chat "hi" 2> "$work/err.txt"; then fail "--chat ran without a chat template"; fi
grep -q "no chat_template.jinja beside the tokenizer" "$work/err.txt" || { cat "$work/err.txt"; fail "the missing template not named"; }
if $tide generate "$work/run" --chat "hi" --chat-template llama3 2> "$work/err.txt"; then
  fail "--chat ran with a template the tokenizer has no tokens for"
fi
grep -q "has no special token <|begin_of_text|> for the llama3 chat template" "$work/err.txt" \
  || { cat "$work/err.txt"; fail "the missing special token not named"; }
$tide convert export "$work/run" --out "$work/hf" 2> /dev/null
test -s "$work/hf/config.json" && test -s "$work/hf/model.safetensors" || fail "export wrote nothing"
grep -q '"eos_token_id": 511' "$work/hf/config.json" || fail "exported config.json names no eos_token_id"
grep -q '"eos_token": "<|endoftext|>"' "$work/hf/tokenizer_config.json" || fail "no tokenizer_config.json naming the eos token"
cmp -s "$work/ds/tokenizer.json" "$work/hf/tokenizer.json" || fail "the export lacks the run's tokenizer"
$tide convert import "$work/hf" --out "$work/imported" 2> /dev/null
$tide generate "$work/imported" --prompt "GNU" --max-tokens 10 --seed 1 > "$work/gen2.txt"
cmp -s "$work/gen.txt" "$work/gen2.txt" || fail "imported weights generate differently"
# A SentencePiece tokenizer.model (LLaMA-1/2 style) tokenises a dataset too.
spm_train --input="$work/gpl.txt" --model_prefix="$work/spm" --model_type=bpe --vocab_size=400 \
  --normalization_rule_name=identity --byte_fallback=true --minloglevel=2 > /dev/null 2>&1 || fail "spm_train failed"
$tide data prepare "$work/gpl.txt" --out "$work/ds-spm" --tokenizer "$work/spm.model" 2> /dev/null
grep -q '"tokenizer": "tokenizer.model"' "$work/ds-spm/dataset.json" || fail "dataset does not name tokenizer.model"
cmp -s "$work/spm.model" "$work/ds-spm/tokenizer.model" || fail "tokenizer.model not copied unchanged"

# profile: LibTorch's profiler on the chosen rank of two, for the chosen steps.
$tide train "$work/tiny.lua" --nproc 2 --run-dir "$work/prof" --quiet --set batch.global_batch=8 --set eval.every=0 \
  --set profile.start_step=2 --set profile.steps=2 --set 'profile.ranks=[1]' 2> "$work/prof.txt" \
  || { cat "$work/prof.txt"; fail "a profiled run failed"; }
test "$(ls "$work/prof/profile")" = "$(printf 'steps-2-3-rank-1.summary.txt\nsteps-2-3-rank-1.trace.json')" \
  || { ls "$work/prof/profile"; fail "profile/ should hold rank 1's trace and summary of steps 2-3 alone"; }
python3 - "$work/prof/profile/steps-2-3-rank-1.trace.json" <<'PY' || fail "the trace is not a Chrome trace of steps 2 and 3"
import json, sys
names = {e.get("name") for e in json.load(open(sys.argv[1]))["traceEvents"]}
assert {"ProfilerStep#2", "ProfilerStep#3", "tide::update"} <= names and "ProfilerStep#4" not in names, sorted(names)[:20]
PY
grep -q "profile: steps 2-3 written to" "$work/prof/train-rank1.log" || fail "rank 1's log does not name its profile"

# SIGTERM / Ctrl-C outside a daemon: the run stops at a step boundary after a checkpoint,
# exits 128 + signal, and --resume auto carries on from it. One process, then a launcher
# of two workers (the signal reaches only the launcher, as a terminal's Ctrl-C would:
# the workers have their own process group).
cat > "$work/long.lua" <<LUA
return tide.recipe {
  name = "cli-long",
  model = tide.models.llama { vocab_size = 512, dim = 32, n_layers = 1, n_heads = 2, max_seq_len = 64, multiple_of = 16 },
  data = { path = "$work/ds", seq_len = 32 },
  batch = { micro_batch = 4, global_batch = 8 },
  schedule = { steps = 1000000, warmup_steps = 1 },
  threads = 1,
}
LUA
stop_after_steps() {  # run-dir signal rc [train args...]
  local dir=$1 sig=$2 want=$3; shift 3
  setsid $tide train "$work/long.lua" --run-dir "$dir" --quiet "$@" 2> "$dir.txt" &
  local pid=$! rows=0
  for _ in $(seq 1200); do
    rows=$(wc -l 2> /dev/null < "$dir/metrics.jsonl" || echo 0)
    [ "$rows" -ge 3 ] && break
    sleep 0.1
  done
  [ "$rows" -ge 3 ] || { kill -KILL -- -$pid; cat "$dir.txt"; fail "$dir: no training steps within 120 s"; }
  kill -$sig -- -$pid
  local rc=0
  wait $pid || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$dir.txt"; fail "$dir: exit status $rc after SIG$sig, expected $want"; }
  local step
  step=$(cat "$dir/checkpoints/latest" 2> /dev/null) || { cat "$dir.txt"; fail "$dir: no checkpoint after SIG$sig"; }
  step=$((10#${step#step-}))
  [ "$step" -ge 3 ] || fail "$dir: checkpoint at step $step, before the 3 steps already logged"
  [ "$(wc -l < "$dir/metrics.jsonl")" -eq "$step" ] || fail "$dir: metrics.jsonl rows differ from the checkpoint's step $step"
  $tide train "$work/long.lua" --run-dir "$dir" --quiet --resume auto --set schedule.steps=$((step + 2)) "$@" \
    2> "$dir.resume.txt" || { cat "$dir.resume.txt"; fail "$dir: resume failed"; }
  grep -q "resumed from .*step-0*$step" "$dir.resume.txt" "$dir/train.log" || { cat "$dir.resume.txt"; fail "$dir: did not resume from step $step"; }
  [ "$(wc -l < "$dir/metrics.jsonl")" -eq $((step + 2)) ] || fail "$dir: resumed run logged other than 2 more steps"
}
stop_after_steps "$work/sigterm" TERM 143
stop_after_steps "$work/sigint2" INT 130 --nproc 2

# docs/recipes.md carries the field table the schema generates.
$tide recipe fields > "$work/fields.md"
python3 - "$work/fields.md" "$src/docs/recipes.md" <<'PY' || fail "docs/recipes.md is out of date: regenerate its table with 'tide recipe fields'"
import sys
table, doc = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if table in doc else 1)
PY
echo "cli end-to-end: ok"
