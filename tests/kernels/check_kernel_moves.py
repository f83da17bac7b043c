#!/usr/bin/env python3
"""Checks in the PTX of tide's CUDA kernels that they move memory as written.

The kernels that move 16-byte packs (RMSNorm's warp kernels, RoPE, SwiGLU and the loss's
packed instances) reach their bandwidth only if nvcc keeps each pack one load or store;
nvcc may split one into 2- or 4-byte accesses without a word of warning (it did, in
RoPE's 64-bit-index kernel and in AdamW's working-copy store), and no test on a CPU can
tell. A split access shows in the PTX as accesses 2, 4, 8 or 12 bytes past another, so:

  packs   in a pack-moving kernel, every global access is at an offset that is a
          multiple of 16 bytes from its base register, and the kernel has 16-byte loads
          and 16-byte stores;
  adamw   each AdamW instance with a 2-byte working copy has an 8-byte store: where
          its packed loop writes four elements of the copy (its one-element paths, a
          range's last elements and unaligned ranges, store 2 bytes at a time).

Each kernel family is required to be present, so that a renamed kernel fails the check
instead of leaving it nothing to check.

Usage: check_kernel_moves.py FILE.ptx...   (exit status 1 on any violation)
"""
import argparse
import re
import sys
from collections import defaultdict

PACKED = [
    ("rms_norm_forward_warp", re.compile(r"rms_norm_forward_warp")),
    ("rms_norm_backward_warp", re.compile(r"rms_norm_backward_warp")),
    ("rope_packed", re.compile(r"rope_packed")),
    ("glu_forward_packed", re.compile(r"glu_forward_packed")),
    ("glu_backward_packed", re.compile(r"glu_backward_packed")),
    # cross_entropy_rows_kernel<T, kPacked = true>
    ("cross_entropy_rows_kernel (packed)", re.compile(r"cross_entropy_rows_kernelI.*Lb1E")),
]
ADAMW = re.compile(r"adamw_kernelI(13__nv_bfloat16|6__half)E")
ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+(\S+?)\(")
ACCESS = re.compile(r"\b((?:ld|st)\.global[.\w]*)\s+(.*)$")
ADDRESS = re.compile(r"\[\s*%\w+\s*(?:\+\s*(-?\d+))?\s*\]")


def entries(path):
    """{entry name: [(instruction, offset in bytes)]} of a PTX file's global accesses."""
    found = defaultdict(list)
    name = None
    with open(path) as f:
        for line in f:
            m = ENTRY.match(line)
            if m:
                name = m.group(1)
                found[name]  # an entry without global accesses is still an entry
                continue
            m = ACCESS.search(line)
            if name and m:
                a = ADDRESS.search(m.group(2))
                found[name].append((m.group(1), int(a.group(1) or 0) if a else 0))
    return found


def is_wide(instruction):
    return ".v4." in instruction and (instruction.endswith((".u32", ".f32", ".b32", ".s32")))


def check(all_entries):
    problems = []
    seen = {label: 0 for label, _ in PACKED}
    adamw_seen = 0
    for name, accesses in sorted(all_entries.items()):
        for label, pattern in PACKED:
            if not pattern.search(name):
                continue
            seen[label] += 1
            split = [(i, o) for i, o in accesses if o % 16]
            for i, o in split:
                problems.append(f"{label}: {i} at +{o} bytes, not a multiple of 16 (a pack split?) in {name}")
            if not any(is_wide(i) and i.startswith("ld.") for i, _ in accesses):
                problems.append(f"{label}: no 16-byte load in {name}")
            if not any(is_wide(i) and i.startswith("st.") for i, _ in accesses):
                problems.append(f"{label}: no 16-byte store in {name}")
        if ADAMW.search(name):
            adamw_seen += 1
            if not any(i.startswith("st.") and (i.endswith((".u64", ".b64")) or ".v2.u32" in i or ".v2.b32" in i)
                       for i, _ in accesses):
                problems.append(f"adamw_kernel: no 8-byte store (the working copy's four elements split?) in {name}")
    for label, count in seen.items():
        if count == 0:
            problems.append(f"{label}: no such kernel in the PTX given")
    if adamw_seen == 0:
        problems.append("adamw_kernel: no instance with a 2-byte working copy in the PTX given")
    return problems, sum(seen.values()) + adamw_seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("ptx", nargs="+", help="PTX files of tide's kernels (nvcc -ptx)")
    args = parser.parse_args()
    all_entries = {}
    for path in args.ptx:
        try:
            all_entries.update(entries(path))
        except OSError as e:
            print(f"check_kernel_moves: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
    problems, checked = check(all_entries)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_kernel_moves: {len(problems)} problem(s) in {checked} kernel instance(s)", file=sys.stderr)
        return 1
    print(f"check_kernel_moves: {checked} kernel instances move their packs whole")
    return 0


if __name__ == "__main__":
    sys.exit(main())
