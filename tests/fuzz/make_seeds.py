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
    # GPT-2's and LLaMA-3's layouts, as the tokenizers library writes them.
    for layout, vocab in (("gpt2", 300), ("llama3", 320)):
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


def recipe_seeds(out, src):
    for rel in ("llama/llama-tiny.lua", "bloom/bloom-tiny.lua"):
        path = os.path.join(src, "recipes", rel)
        if os.path.exists(path):
            put(out, "recipe", os.path.basename(rel), read(path) + SEPARATOR + b"schedule.steps=3\noptimizer.lr=1e-3")


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
    recipe_seeds(out, src)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
