"""Seed inputs for tests/fuzz's targets, made by the real producers of those files: tide
(a dataset, a checkpoint), Hugging Face's tokenizers (tests/engine/hf_train_bpe.py) and
safetensors, sentencepiece's spm_train.

Usage: make_seeds.py OUT_DIR TIDE_EXECUTABLE SOURCE_DIR"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import save as save_safetensors

SEPARATOR = b"\n=====tide-fuzz-part=====\n"  # fuzz_input.h's kPartSeparator


def put(out, target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def text_sample():
    # The GPL's text (every Debian system has it, as the tokenizer tests use it; the
    # bundled corpus exists only after `make demo`), with lines of other scripts.
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        text = f.read(40_000)
    return text + "\nGrüße, こんにちは, Привет, مرحبا 🙂 2026-11-26 42\n"


def safetensors_seeds(out):
    rng = np.random.default_rng(1)
    put(out, "safetensors", "weights", save_safetensors({
        "model.embed_tokens.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "model.norm.weight": np.ones(4, dtype=np.float16),
        "step": np.array([7], dtype=np.int64),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }, metadata={"format": "pt", "tide.pieces": "[]"}))
    put(out, "safetensors", "scalar", save_safetensors({"x": np.array(1.5, dtype=np.float64)}))


def tokenizer_seeds(out, text, work, src):
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(text)
    # GPT-2's, LLaMA-3's and Qwen2's (NFC) layouts, as the tokenizers library writes them.
    for layout, vocab in (("gpt2", 300), ("llama3", 320), ("qwen2", 310)):
        path = os.path.join(work, layout + ".json")
        subprocess.run([sys.executable, os.path.join(src, "tests", "engine", "hf_train_bpe.py"), layout, corpus,
                        str(vocab), path], check=True)
        put(out, "tokenizer", layout + ".json", read(path))
    # LLaMA-1/2's: a SentencePiece BPE model with byte fallback.
    prefix = os.path.join(work, "spm")
    subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={prefix}", "--model_type=bpe",
                    "--vocab_size=400", "--normalization_rule_name=identity", "--byte_fallback=true",
                    "--minloglevel=2"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    put(out, "tokenizer", "llama2.model", read(prefix + ".model"))


def dataset_and_checkpoint_seeds(out, text, work, tide, src):
    corpus = os.path.join(work, "docs")
    os.makedirs(corpus)
    for i, start in enumerate(range(0, len(text), 4000)):
        with open(os.path.join(corpus, f"{i:03}.txt"), "w", encoding="utf-8") as f:
            f.write(text[start:start + 4000])
    ds = os.path.join(work, "dataset")
    subprocess.run([tide, "data", "prepare", corpus, "--out", ds, "--vocab-size", "300", "--val-fraction", "0.2"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    put(out, "token_dataset", "prepared", SEPARATOR.join(
        read(os.path.join(ds, name)) for name in ("dataset.json", "train.bin", "train.idx", "val.bin", "val.idx")))
    run = os.path.join(work, "run")
    recipe = os.path.join(src, "recipes", "llama", "llama-tiny.lua")
    settings = {"data.path": ds, "data.seq_len": 16, "device": "cpu", "model.dim": 16, "model.n_layers": 1,
                "model.n_heads": 2, "model.n_kv_heads": 2, "model.max_seq_len": 16, "model.vocab_size": 300,
                "schedule.steps": 2, "schedule.warmup_steps": 0, "eval.every": 0, "checkpoint.every": 2,
                "checkpoint.async": "false", "batch.micro_batch": 2, "batch.global_batch": 2}
    subprocess.run([tide, "train", recipe, "--run-dir", run, "--quiet"] +
                   [a for k, v in settings.items() for a in ("--set", f"{k}={v}")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    step = sorted(d for d in os.listdir(os.path.join(run, "checkpoints")) if d.startswith("step-"))[-1]
    ckpt = os.path.join(run, "checkpoints", step)
    put(out, "checkpoint", "trained", read(os.path.join(ckpt, "manifest.json")) + SEPARATOR +
        read(os.path.join(ckpt, "rank-00000.safetensors")))


def request_seeds(out):
    for i, (kind, body) in enumerate([
            ("info", {}), ("list", {}), ("status", {"run": "r1"}),
            ("submit", {"recipe": "llama/llama-tiny", "overrides": ["schedule.steps=2"], "name": "a"}),
            ("set", {"run": "r1", "values": {"optimizer.lr": 1e-3}}), ("metrics", {"run": "r1", "since_step": 3}),
            ("logs", {"run": "r1", "lines": 5})]):
        put(out, "request", f"{i}-{kind}", json.dumps({"v": 1, "id": i, "type": kind, "body": body}).encode())


def controller_seeds(out):
    # Conversations with one controller: a run submitted, then asked about and driven.
    def frame(i, kind, body):
        return json.dumps({"v": 1, "id": i, "type": kind, "body": body}).encode()
    small = ["schedule.steps=2", "schedule.warmup_steps=0", "device=cpu"]
    tiny = {"recipe_name": "llama/llama-tiny", "overrides": small}
    inline = {"recipe": "return tide.recipe { name = 'b', model = tide.models.llama { vocab_size = 64, dim = 16, "
                        "n_layers = 1, n_heads = 2, max_seq_len = 16 }, data = { path = 'd', seq_len = 16 }, "
                        "schedule = { steps = 3, warmup_steps = 0 }, on_step = function(s) return {} end }",
              "workers": 1, "priority": 2, "idempotency_key": "k", "workdir": "/tmp"}
    run = {"run": "llama-tiny-1"}
    def worker(kind, body, rank=0):
        return ("worker", f"llama-tiny-1:1:{rank}", {"type": kind, "run": "llama-tiny-1", "attempt": 1, "rank": rank,
                                                      "body": body})
    metrics = {"step": 1, "total_steps": 2, "loss": 5.5, "grad_norm": 1.2, "lr": 1e-3, "tokens": 2048,
               "tokens_per_second": 900.0, "step_seconds": 2.2, "time": 1795000012.5}
    for name, frames in {
            "worker-steps": [("submit", tiny), worker("hello", {}), worker("metrics", metrics),
                             worker("rank", {**metrics, "rss_mb": 300.0, "comm_bytes": 0})],
            "worker-events": [("submit", tiny), worker("event", {"kind": "checkpoint", "body": {
                                  "step": 2, "path": "checkpoints/step-00000002", "seconds": 0.5}}),
                              worker("event", {"kind": "applied", "body": {"step": 1, "id": "3",
                                                                          "values": {"optimizer.lr": 1e-4}}}),
                              ("status", run)],
            "worker-decide": [("submit", tiny), worker("decide", {"query": 1, "anomaly": {
                                  "step": 1, "kind": "loss_spike", "value": 9.0, "score": 5.0, "action": "skip"}}),
                              worker("log", {"level": "info", "line": "step 1"}),
                              worker("done", {"final_loss": 5.4, "last_step": 2})],
            "worker-error": [("submit", tiny), worker("error", {"message": "out of memory"}), worker("heartbeat", {}),
                             ("logs", {**run, "lines": 5})],
            # What a worker never sends: a rank the run does not have, a type that is not a
            # string, a body that is not an object, a field of the wrong type.
            "worker-hostile": [("submit", tiny), worker("rank", {"step": 1}, rank=7),
                               ("worker", "llama-tiny-1:1:0", {"type": 5, "body": "x"}),
                               worker("decide", {"query": "q", "anomaly": []})],
            "submit-status": [("submit", tiny), ("status", run), ("list", {"state": "failed"}),
                              ("metrics", {**run, "since_step": 0, "limit": 10, "source": "ranks"})],
            "submit-set": [("submit", tiny), ("set", {**run, "values": {"optimizer.lr": 1e-3, "batch.global_batch": 8,
                                                                        "anomaly.on_loss_spike": "skip"}}),
                           ("recipe", run), ("logs", {**run, "lines": 3, "source": "worker", "rank": 0})],
            "submit-control": [("submit", inline), ("pause", {"run": "b-1"}), ("resume", {"run": "b-1"}),
                               ("cancel", {"run": "b-1"})],
            "submit-export": [("submit", tiny), ("checkpoints", run), ("export", {**run, "out": "hf", "dtype": "BF16"}),
                              ("exports", {**run, "export": "export-1"})],
            "plan": [("plan", {"recipe_name": "llama/llama-tiny", "cluster": {"device": "h100-80", "nodes": 2,
                                                                              "devices_per_node": 8},
                               "top": 3, "max_micro_batch": 8, "zero": 1}), ("info", {})],
            "verify": [("submit", tiny), ("verify", {**run, "step": 2}), ("stop", run), ("shutdown", {})],
    }.items():
        put(out, "controller", name, SEPARATOR.join(
            f"worker {f[1]}\n".encode() + json.dumps(f[2]).encode() if f[0] == "worker" else frame(i, *f)
            for i, f in enumerate(frames)))


HTTP_TOKEN = "0123456789abcdef" * 4  # fuzz_http.cpp's kToken


def http_seeds(out):
    # Requests as a browser, curl or a Prometheus scraper write them to tided's HTTP port.
    def request(method, path, headers=(), body=b""):
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1:7453", *headers]
        if method == "POST" and not any(h.startswith("Transfer-Encoding") for h in headers):
            lines.append(f"Content-Length: {len(body)}")
        # Latin-1: each character one byte, so a path can hold bytes that are not UTF-8.
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    token = f"Authorization: Bearer {HTTP_TOKEN}"
    json_type = "Content-Type: application/json"
    for name, data in {
            "metrics": request("GET", "/metrics", ["Accept: text/plain"]),
            "info": request("GET", "/api/info"),
            "runs": request("GET", "/api/runs", ["Connection: keep-alive"]) + request("GET", "/api/runs/r1"),
            "run-metrics": request("GET", "/api/runs/r1/metrics?since_step=3&limit=50&source=ranks"),
            "run-logs": request("GET", "/api/runs/r1/logs?lines=20&rank=1&source=worker"),
            "run-parts": request("GET", "/api/runs/r1/checkpoints") + request("GET", "/api/runs/r1/recipe"),
            "events": request("GET", "/api/events?run=r1", ["Accept: text/event-stream"]),
            "page": request("GET", "/", ["Accept: text/html"]) + request("GET", "/assets/app.js"),
            "set": request("POST", "/api/runs/r1/set", [token, json_type],
                           json.dumps({"values": {"optimizer.lr": 1e-4, "eval.every": 50}}).encode()),
            "export": request("POST", "/api/runs/r1/export", [token, json_type],
                              json.dumps({"out": "hf", "step": 10, "dtype": "bf16"}).encode()),
            "verify": request("POST", "/api/runs/r1/verify", [token, json_type], b'{"step": 5}'),
            "pause-other-site": request("POST", "/api/runs/r1/pause", [token, "Origin: http://evil.example"]),
            "stop-no-token": request("POST", "/api/runs/r1/stop"),
            "chunked": request("POST", "/api/runs/r1/set", [token, json_type, "Transfer-Encoding: chunked"]) +
                       b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (b'{"values": {"seed"', b": 1}}", b"")),
            "ranges": request("GET", "/metrics", ["Range: bytes=0-10,20-30"]),
            # Once a finding: a query that is not UTF-8 threw inside the server.
            "not-utf8": request("GET", "/api/runs/r1/logs?source=work\xcf\xcfer"),
    }.items():
        put(out, "http", name, data)


def recipe_seeds(out, src):
    for rel in ("llama/llama-tiny.lua", "bloom/bloom-tiny.lua"):
        path = os.path.join(src, "recipes", rel)
        if os.path.exists(path):
            put(out, "recipe", os.path.basename(rel), read(path) + SEPARATOR + b"schedule.steps=3\noptimizer.lr=1e-3")


def fine_tuning_seeds(out):
    # TRL's prompt-completion pairs, OpenAI-style and ShareGPT conversations, as users write them.
    pairs = [{"prompt": "Q: What is 2 + 2?\nA:", "completion": " 4"}, {"prompt": "", "completion": "caf\u00e9"}]
    put(out, "fine_tuning_examples", "prompt-completion.jsonl", "".join(json.dumps(p) + "\n" for p in pairs).encode())
    chats = [{"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "2 + 2?"},
                           {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"},
                           {"role": "assistant", "content": "\n\n6 "}]},
             {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "<|im_end|>hello"}]},
             {"messages": [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": " parts"}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]},
             # Tool use: the functions, calls with arguments as an object and as a string, results.
             {"tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
              "messages": [{"role": "user", "content": "2 + 2?"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}},
                               {"name": "add", "arguments": "{\"a\": 1}"}]},
                           {"role": "tool", "content": "4"}, {"role": "tool", "content": "1"},
                           {"role": "assistant", "content": "4"}]}]
    put(out, "fine_tuning_examples", "messages.jsonl", "".join(json.dumps(c) + "\n" for c in chats).encode())


def main():
    out, tide, src = sys.argv[1:4]
    work = os.path.join(out, ".work")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(work)
    text = text_sample()
    safetensors_seeds(out)
    tokenizer_seeds(out, text, work, src)
    dataset_and_checkpoint_seeds(out, text, work, tide, src)
    request_seeds(out)
    controller_seeds(out)
    http_seeds(out)
    recipe_seeds(out, src)
    fine_tuning_seeds(out)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
