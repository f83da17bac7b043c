#!/usr/bin/env python3
"""A byte-level BPE tokenizer.json trained by Hugging Face's tokenizers library (PyPI
`tokenizers`, in the project's .venv), laid out as that library lays out GPT-2's or
LLaMA-3's (special tokens first, then the byte alphabet in its own order, then merges)
or Qwen2's (an NFC normalizer, single-digit numbers, special tokens added after the
vocabulary). Its byte tokens are not ids 0-255, unlike the files tide trains.

Usage: hf_train_bpe.py gpt2|llama3|qwen2 CORPUS VOCAB_SIZE OUT.json
"""
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("gpt2", "llama3", "qwen2"):
        sys.exit(__doc__)
    layout, corpus, vocab_size, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if layout == "gpt2":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        special = ["<|endoftext|>"]
    elif layout == "qwen2":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = []
    else:
        tokenizer = Tokenizer(models.BPE(ignore_merges=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([corpus], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if layout == "qwen2":
        tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokenizer.save(out)


if __name__ == "__main__":
    main()
