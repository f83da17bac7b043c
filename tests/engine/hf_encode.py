#!/usr/bin/env python3
"""Reference ids from Hugging Face's tokenizers library (the Rust implementation, PyPI
`tokenizers`, in the project's .venv).

Usage: hf_encode.py tokenizer.json < lines.json   (a JSON array of strings)
Prints a JSON array with the ids of each line (no special tokens added).
"""
import json
import sys

from tokenizers import Tokenizer

if len(sys.argv) != 2:
    sys.exit(__doc__)
tokenizer = Tokenizer.from_file(sys.argv[1])
lines = json.load(sys.stdin)
print(json.dumps([tokenizer.encode(line, add_special_tokens=False).ids for line in lines]))
