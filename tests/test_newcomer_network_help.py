"""scripts/shaped_network.sh and scripts/cluster_network.sh: ``--help`` and ``-h`` print the usage
on stdout and exit 0; a usage error still prints it on stderr and exits 2. No root needed."""

import os
import subprocess

import pytest

from tests.mpirun import ROOT

USAGE = {
    "shaped_network.sh": "usage: shaped_network.sh --rate RATE",
    "cluster_network.sh": "usage: cluster_network.sh --hosts N",
}


def _run(script, *args):
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", script), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", sorted(USAGE))
def test_help_prints_the_usage_on_stdout_and_exits_0(script, flag):
    result = _run(script, flag, "--", "false")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith(USAGE[script]) and "--rate RATE" in result.stdout


@pytest.mark.parametrize("script", sorted(USAGE))
def test_a_usage_error_still_goes_to_stderr_with_status_2(script):
    result = _run(script, "--bogus")
    assert result.returncode == 2 and result.stdout == ""
    first, usage = result.stderr.splitlines()[:2]
    assert first == f"{script}: unknown argument '--bogus' (the command goes after --)"
    assert usage.startswith(USAGE[script])
