"""The kernel build directory (under ~/.cache/drafttree/kernels) of the sources at a git revision of this checkout
(stop 57), as gemm._build names it: python logs/s57_build_key.py [REV] (default: the working tree)."""
import hashlib
import subprocess
import sys

import torch

from drafttree.kernels import gemm

rev = sys.argv[1] if len(sys.argv) > 1 else None
parts = []
for p in gemm.SOURCES:
    if rev is None:
        parts.append(p.read_bytes())
    else:
        rel = p.resolve().relative_to(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
        parts.append(subprocess.check_output(["git", "show", f"{rev}:{rel}"]))
key = hashlib.sha256(b"".join(parts) + torch.__version__.encode() + gemm._cpu_flags().encode() + sys.version.encode()
                     + str(gemm.SOURCE.parent.resolve()).encode())
print(key.hexdigest()[:16])
