"""The C ABI is frozen: every TIDE_API prototype of tide.h must match capi/abi.txt, the
library must export exactly those functions, and status codes and run states must be
unique. Usage: check_abi.py HEADER ABI_LIST LIBRARY"""
import re
import subprocess
import sys
from collections import Counter

header, abi_list, library = sys.argv[1:4]
text = open(header).read()
text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
prototypes = [" ".join(p.split()) for p in re.findall(r"^TIDE_API\s+([^;]+);", text, flags=re.M)]
frozen = [line.strip() for line in open(abi_list) if line.strip() and not line.startswith("#")]
failures = []
for p in frozen:
    if p not in prototypes:
        failures.append(f"changed or removed: {p}")
for p in prototypes:
    if p not in frozen:
        failures.append(f"new and not yet in {abi_list} (append it): {p}")
names = {re.search(r"(\w+)\s*\(", p).group(1) for p in prototypes}
nm = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
exported = {m.group(1) for m in re.finditer(r" T (\w+)@@TIDE_0", nm)}
if exported != names:
    failures.append(f"exported {sorted(exported - names)} not declared; declared {sorted(names - exported)} not exported")
for prefix in ("TIDE_ERR_", "TIDE_RUN_"):
    values = {n: v for n, v in re.findall(rf"#define ({prefix}[A-Z_]+) (-?\d+)\b", text)
              if not n.endswith("_VERSION")}
    twice = [v for v, c in Counter(values.values()).items() if c > 1]
    if twice:
        failures.append(f"{prefix}* values used twice: {twice}")
if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"C ABI: {len(prototypes)} functions as frozen, exported as TIDE_0; codes and states unique")
