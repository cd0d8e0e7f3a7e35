"""The command-line scripts import the project's packages as installed, and say what to do when
they are not."""

import os
import subprocess
import sys

import pytest
from entry_points import ROOT

SCRIPTS = ("bench_allreduce", "simulate", "ddp_compare")


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("package", ["syncbench", "compressors"])
def test_a_missing_package_is_one_line_and_exit_status_2(script, package):
    hide = (
        f"import runpy, sys; sys.modules[{package!r}] = None; sys.argv = [{script!r}]; "
        f"runpy.run_path('scripts/{script}.py', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"{script}.py: the package {package!r} is not installed: run `pip install -e .` in the "
        "repository first"
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_do_not_edit_the_import_path(script):
    with open(os.path.join(ROOT, "scripts", f"{script}.py")) as handle:
        text = handle.read()
    assert "sys.path" not in text and "E402" not in text
