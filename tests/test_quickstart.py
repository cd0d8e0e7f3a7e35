"""scripts/quickstart.sh: install into .venv once, train, print the accuracy; then reuse it."""

import json
import os
import subprocess
import sys

import pytest

from tests.mpirun import ROOT, environment

VENV = os.path.join(ROOT, ".venv")


def _quickstart(log_dir, *flags):
    env = dict(environment(), NWORKERS="2", LOG_DIR=str(log_dir))
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "quickstart.sh"), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.skipif(
    os.path.realpath(sys.prefix) != os.path.realpath(VENV),
    reason="quickstart.sh installs into the repository's .venv; run the tests from that venv",
)
def test_quickstart_trains_prints_the_accuracy_and_then_reuses_the_environment(tmp_path):
    first = _quickstart(tmp_path / "first", "--max-epochs", "1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    second = _quickstart(tmp_path / "second", "--max-epochs", "1", "--compression")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "quickstart: reusing .venv (requirements unchanged)" in second.stdout
    assert "installing requirements.txt" not in second.stdout
    for run, name, compressor in ((first, "first", "dense"), (second, "second", "spardl")):
        metrics = tmp_path / name / "metrics.jsonl"
        with open(metrics) as lines:
            rows = [json.loads(line) for line in lines]
        assert run.stdout.strip().splitlines()[-1] == (
            f"quickstart: final test accuracy {100 * rows[-1]['test_acc']:.2f}% after 1 epoch "
            f"({compressor}, 2 ranks); metrics in {metrics}"
        )


def test_quickstart_refuses_a_bad_rank_count():
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "quickstart.sh")],
        env=dict(os.environ, NWORKERS="four"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == "quickstart: error: NWORKERS must be a positive integer, got 'four'\n"
