"""The hook on CUDA (NCCL, and Lightning's DDPStrategy): runs where a GPU is."""

import os
import subprocess
import sys

import pytest
import torch

from tests.mpirun import ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_overlapped_hook_on_the_gpu_gives_the_bits_of_the_blocking_one():
    run = _run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        "tests/ddp_gpu_check.py",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ddp gpu checks passed" in run.stdout


def test_hook_through_lightnings_ddp_strategy():
    pytest.importorskip("lightning")
    run = _run("tests/lightning_check.py")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "lightning hook checks passed" in run.stdout
