#!/usr/bin/env python3
"""Fails when a std-library symbol that tide's code uses binds to a copy inside another library.

PyTorch's wheels are linked with parts of a newer libstdc++ inside (libtorch_cpu.so
exports std::filesystem, libc10.so std::basic_stringbuf::str() and more). Where such a
library comes before libstdc++.so.6 in a process's lookup order, tide's calls go to that
copy, built by another compiler for another ABI: PyTorch 2.11's std::filesystem::remove_all
crashed every checkpoint prune that way. tide links libstdc++ first (cmake/Linking.cmake);
this check asks the dynamic linker itself where each symbol lands.

The same binaries must hold no symbol of namespace gloo, defined or referenced: tide
compiles ProcessGroupGloo.hpp against whatever gloo headers the system has (PyTorch's
wheels ship none), which is sound only while no gloo code is compiled into or called
from tide (docs/building.md, "Gloo").

Each binary is started with LD_BIND_NOW=1 (every symbol is bound at load) and
LD_DEBUG=bindings; an executable runs with --help (a GoogleTest binary with
--gtest_list_tests), a shared library is loaded by ctypes. Every binding made from one of
tide's files (those under --ours) of a symbol in namespace std must land in libstdc++,
libgcc_s, libc, libm or a file of tide's own.

Usage: check_symbol_binding.py --ours BUILD_DIR FILE...
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

# Mangled names in namespace std: St, or one of the abbreviations Sa Sb Ss Si So Sd, after an
# optional nested-name prefix with qualifiers, possibly under a special name (vtable, typeinfo,
# typeinfo name, guard variable).
STD_SYMBOL = re.compile(r"^_Z(?:T[VITS]|GV)?N?[KVrRO]*S[tabsiod]")
STD_PROVIDERS = re.compile(r"/(libstdc\+\+|libgcc_s|libc|libm)\.so[.0-9]*$")
GLOO_SYMBOL = re.compile(r"^_Z(?:T[VITS]|GV)?N?[KVrRO]*4gloo")
BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \w+ symbol `([^']+)'")


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def is_executable(path):
    with open(path, "rb") as f:
        header = f.read(18)
    # ELF e_type: 2 = EXEC, 3 = DYN (a PIE executable or a shared library).
    if header[:4] != b"\x7fELF":
        raise SystemExit(f"{path}: not an ELF file")
    return not re.search(r"\.so(\.[0-9]+)*$", path)


def bindings_of(path):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_BIND_NOW="1", LD_DEBUG="bindings", LD_DEBUG_OUTPUT=os.path.join(tmp, "ld"))
        if is_executable(path):
            args = [path, "--gtest_list_tests"] if os.path.basename(path).endswith("_tests") else [path, "--help"]
        else:
            args = [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", path]
        proc = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"{path}: '{' '.join(args[1:])}' exited with {proc.returncode}: "
                             f"{proc.stderr.decode(errors='replace')[-500:]}")
        lines = []
        for log in glob.glob(os.path.join(tmp, "ld.*")):
            with open(log, errors="replace") as f:
                lines.extend(f)
    if not lines:
        raise SystemExit(f"{path}: the dynamic linker reported no bindings (LD_DEBUG ignored?)")
    return lines


def gloo_symbols(path):
    out = subprocess.run(["nm", "--format=just-symbols", path], capture_output=True, text=True)
    if out.returncode != 0 and "no symbols" not in out.stderr:
        raise SystemExit(f"{path}: nm failed: {out.stderr.strip()}")
    dyn = subprocess.run(["nm", "-D", "--format=just-symbols", path], capture_output=True, text=True)
    names = set(out.stdout.split()) | set(dyn.stdout.split())
    return sorted(n for n in names if GLOO_SYMBOL.match(n))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="tide's build directory: files under it are tide's")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    ours = os.path.realpath(args.ours) + os.sep

    failures = []
    checked = 0
    for path in args.files:
        path = os.path.realpath(path)
        bad = {}
        for line in bindings_of(path):
            m = BINDING.search(line)
            if not m:
                continue
            source, target, symbol = (os.path.realpath(m.group(1)) if m.group(1).startswith("/") else m.group(1),
                                      os.path.realpath(m.group(2)), m.group(3))
            if not source.startswith(ours) and source != path:
                continue
            if not STD_SYMBOL.match(symbol):
                continue
            checked += 1
            if STD_PROVIDERS.search(target) or target.startswith(ours) or target == path:
                continue
            bad[symbol] = (source, target)
        for (symbol, (source, target)), name in zip(sorted(bad.items()), demangle(sorted(bad))):
            failures.append(f"{os.path.basename(source)}: {name}\n    binds to {target}")
        gloo = gloo_symbols(path)
        for name in demangle(gloo):
            failures.append(f"{os.path.basename(path)}: holds the gloo symbol {name}")
    for f in failures:
        print(f, file=sys.stderr)
    if failures:
        print(f"{len(failures)} failures: a std-library symbol of tide's must bind to libstdc++ (link it "
              f"before LibTorch: cmake/Linking.cmake); no gloo symbol may enter tide", file=sys.stderr)
        return 1
    if checked == 0:
        print("no std-library binding was seen: the check saw nothing", file=sys.stderr)
        return 1
    print(f"{len(args.files)} binaries: {checked} std-library bindings, all to libstdc++/libgcc/libc or tide "
          f"itself; no gloo symbol")
    return 0


if __name__ == "__main__":
    sys.exit(main())
