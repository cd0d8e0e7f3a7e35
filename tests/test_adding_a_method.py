"""The minimal method of docs/ADDING_A_METHOD.md, kept outside the repository and named in
``SPARDL_TEST_METHODS``, runs the registry-wide tests with no new test code; a wrong variant of it
fails them."""

import os
import re
import subprocess
import sys

from tests.mpirun import ROOT, environment

PAGE = os.path.join(ROOT, "docs", "ADDING_A_METHOD.md")


def example() -> str:
    """The page's first Python block: the ``mytopk`` module."""
    return re.search(r"```python\n(.*?)```", open(PAGE).read(), re.S).group(1)


def run_suite(tmp_path, source: str, *selection: str):
    (tmp_path / "mytopk_plugin.py").write_text(source)
    env = dict(
        environment(),
        SPARDL_TEST_METHODS="mytopk_plugin",
        PYTHONPATH=os.pathsep.join((ROOT, str(tmp_path))),
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_documented_method_passes_the_registry_wide_tests(tmp_path):
    run = run_suite(
        tmp_path, example(), "tests/test_baselines.py", "tests/test_synchronizer.py", "-k", "mytopk"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", run.stdout).group(1))
    assert passed >= 60, run.stdout[-500:]  # 48 invariants, state, warm-up, registry, the contract


def test_a_method_that_forgets_to_divide_by_p_fails_them(tmp_path):
    source = example()
    assert "self.size)\n" in source
    wrong = source.replace(
        "scatter_average_in_order(result, [lists[r] for r in range(self.size)], self.size)",
        "scatter_average_in_order(result, [lists[r] for r in range(self.size)], 1)",
    )
    assert wrong != source
    run = run_suite(
        tmp_path, wrong, "tests/test_baselines.py", "-x", "-k", "mytopk and invariants and 2003"
    )
    assert run.returncode == 1 and "mass not conserved" in run.stdout, run.stdout[-3000:]
