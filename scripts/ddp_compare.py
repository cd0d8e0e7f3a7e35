#!/usr/bin/env python
"""DDP with each of a list of hooks, timed side by side in one interleaved run (Gloo, torchrun).

    torchrun --standalone --nproc-per-node 4 scripts/ddp_compare.py \
        --model vgg16 --hooks compute,ddp,ddp_fp16,powersgd,topk,spardl --density 0.01

Prints the median seconds per iteration of every hook, its exposed wait after backward's last
gradient and its ratio to ``compute`` (compute alone); ``--json FILE`` keeps every iteration. The
library: ``syncbench.ddp_compare``; the figures and their commands: docs/PERFORMANCE.md, "DDP
and its hooks end to end".
"""

import os
import sys

try:
    from syncbench.ddp_compare import main
except ModuleNotFoundError as missing:
    package = (missing.name or "").split(".")[0]
    if package not in ("compressors", "allreducers", "syncbench"):
        raise
    if os.environ.get("RANK", "0") == "0":
        print(
            f"ddp_compare.py: the package {package!r} is not installed: run "
            "`pip install -e .` in the repository first",
            file=sys.stderr,
        )
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
