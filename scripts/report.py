#!/usr/bin/env python
"""Paper-style tables and plots from the ``metrics.jsonl`` of training runs: the command line of
the ``trainreport`` package (``--help`` says what it reports).

    scripts/report.py runs/vgg16_spardl runs/vgg16_oktopk runs/vgg16_dense --out report/
"""

import sys

try:
    from trainreport.cli import main
except ImportError as error:
    print(
        f"report.py: cannot import the trainreport package ({error}); run `pip install -e .` "
        "in the repository first",
        file=sys.stderr,
    )
    sys.exit(2)

if __name__ == "__main__":
    main()
