"""`tide plan --json` against its documented schema (docs/plan.schema.json), validated
by the jsonschema package: a large model on a GPU cluster, a small one on this CPU, a
mixture of experts (expert parallelism weighed), one that fits nowhere (and exits non-zero, still printing a valid plan).

Usage: plan_schema_test.py TIDE SOURCE_DIR
"""
import json
import subprocess
import sys

import jsonschema

tide, src = sys.argv[1], sys.argv[2]
schema = json.load(open(f"{src}/docs/plan.schema.json"))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)

cases = [
    (["llama/llama-2-70b", "--nodes", "4", "--gpus-per-node", "8", "--device", "h100-80", "--top", "5"], 0),
    (["bloom/bloom-tiny", "--nproc", "2", "--top", "3"], 0),
    (["qwen/qwen1.5-moe-a2.7b", "--nodes", "2", "--gpus-per-node", "8", "--device", "h100-80", "--top", "3"], 0),
    (["llama/llama-2-70b", "--device", "l40s", "--gpus-per-node", "2", "--no-offload"], 1),
]
for args, expected in cases:
    p = subprocess.run([tide, "plan", *args, "--json"], capture_output=True, text=True)
    assert p.returncode == expected, f"tide plan {' '.join(args)}: exit {p.returncode}\n{p.stderr}"
    plan = json.loads(p.stdout)
    errors = sorted(validator.iter_errors(plan), key=lambda e: list(e.path))
    assert not errors, f"tide plan {' '.join(args)}: " + "; ".join(
        f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
    print(f"  {' '.join(args)}: {plan['layouts_that_fit']} layouts fit, {len(plan['rejected'])} refused, valid")
print("plan schema: ok")
