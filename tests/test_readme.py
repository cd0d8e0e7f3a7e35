"""The README's library example runs as shown: under mpiexec, and under torchrun with the
README's torch.distributed lines in place of the MPI ones."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpirun import ROOT, environment, mpiexec

pytestmark = pytest.mark.mpi

MPI_LINES = (
    "from mpi4py import MPI\n",
    "comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()\n",
)


def blocks():
    text = Path(ROOT, "README.md").read_text()
    section = text.split("## The library in a few lines", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def check(result, workers):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    sent = [
        int(n) for n in re.findall(r"rank \d+: sent (\d+) bytes in the last step", result.stdout)
    ]
    assert len(sent) == workers and all(n > 0 for n in sent), result.stdout


def test_the_readme_example_under_mpiexec(tmp_path):
    example, _ = blocks()
    (tmp_path / "train.py").write_text(example)
    check(mpiexec(2, str(tmp_path / "train.py"), timeout=120), 2)


def test_the_readme_example_under_torchrun(tmp_path):
    example, torch_lines = blocks()
    assert all(line in example for line in MPI_LINES), "the README's MPI lines changed"
    example = example.replace(MPI_LINES[0], "").replace(MPI_LINES[1], torch_lines)
    (tmp_path / "train.py").write_text(example)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    result = subprocess.run(
        [*command, str(tmp_path / "train.py")],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(result, 2)
