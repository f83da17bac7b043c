#!/usr/bin/env python3
"""Reference ids from Hugging Face's tokenizers library (the Rust implementation, PyPI
`tokenizers`, in the project's .venv).

Usage: hf_encode.py tokenizer.json < lines.json   (a JSON array of strings)
Prints a JSON object: "ids", the ids of each line (no special tokens added), and
"decoded", those ids decoded back to text (normalised text, where the file normalises).
"""
import json
import sys

from tokenizers import Tokenizer

if len(sys.argv) != 2:
    sys.exit(__doc__)
tokenizer = Tokenizer.from_file(sys.argv[1])
lines = json.load(sys.stdin)
ids = [tokenizer.encode(line, add_special_tokens=False).ids for line in lines]
print(json.dumps({"ids": ids, "decoded": [tokenizer.decode(i, skip_special_tokens=False) for i in ids]}))
