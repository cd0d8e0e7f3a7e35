"""The code stays short enough to read: no function of the library, the trainer or the tools over
80 lines, and main_trainer.py a thin entry point of at most 150."""

import ast
import glob
import os

from mpirun import ROOT

LIMIT = 80
PACKAGES = ("allreducers", "compressors", "trainer", "syncbench", "trainreport")


def long_functions(paths, limit=LIMIT):
    """``file:function (N lines)`` for each function of ``paths`` longer than ``limit`` lines."""
    long = []
    for path in paths:
        with open(path) as handle:
            tree = ast.parse(handle.read())
        long += [
            f"{os.path.relpath(path, ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit
        ]
    return long


def test_no_function_of_the_packages_is_longer_than_80_lines():
    paths = sorted(
        path
        for package in PACKAGES
        for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True)
    )
    assert len(paths) > 50
    assert long_functions(paths) == []


def test_the_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    pass\n")
    assert [line.split(":")[1] for line in long_functions([str(tmp_path / "long.py")])] == [
        "long (81 lines)"
    ]


def test_main_trainer_is_a_thin_entry_point():
    with open(os.path.join(ROOT, "main_trainer.py")) as handle:
        assert len(handle.read().splitlines()) <= 150
