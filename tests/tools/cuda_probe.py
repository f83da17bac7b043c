"""Whether this machine can run the CUDA tests (ctest label cuda), asked of the torch that
shares tide's LibTorch. Exit 0: a CUDA device is usable. Otherwise the test is skipped:
"skipped: no CUDA device" and exit 77 (ctest's SKIP_RETURN_CODE), unless
TIDE_REQUIRE_CUDA=1 (make gpu-test sets it), where a missing device is a failure (exit 1).
"""
import os
import sys

import torch

if torch.cuda.is_available():
    sys.exit(0)
if os.environ.get("TIDE_REQUIRE_CUDA") == "1":
    print(f"no CUDA device usable by torch {torch.__version__} (CUDA {torch.version.cuda}), "
          "and TIDE_REQUIRE_CUDA=1", file=sys.stderr)
    sys.exit(1)
print("skipped: no CUDA device")
sys.exit(77)
