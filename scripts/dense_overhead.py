#!/usr/bin/env python
"""``dense`` against a bare MPI all-reduce of the same buffer, from one interleaved run: the
command line of ``syncbench.dense_overhead`` (``--help`` says what it times).

    .venv/bin/mpiexec -n 8 .venv/bin/python scripts/dense_overhead.py --numel 14728266
"""

import sys

try:
    from syncbench.dense_overhead import main
except ImportError as error:
    print(
        f"dense_overhead.py: cannot import the syncbench package ({error}); run `pip install -e .` "
        "in the repository first",
        file=sys.stderr,
    )
    sys.exit(2)

if __name__ == "__main__":
    main()
