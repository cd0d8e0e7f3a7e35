"""The report package's functions stay short enough to read: at most 80 lines each."""

import ast
import glob
import os

from mpirun import ROOT

LIMIT = 80


def test_no_function_of_the_report_package_is_longer_than_80_lines():
    long = []
    for path in sorted(glob.glob(os.path.join(ROOT, "trainreport", "*.py"))):
        with open(path) as handle:
            tree = ast.parse(handle.read())
        long += [
            f"{os.path.basename(path)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LIMIT
        ]
    assert not long
