"""attach with accelerate's FSDP2 plugin: 2 CPU processes under torchrun (Gloo)."""

import os
import subprocess
import sys

import pytest

from tests.mpirun import ROOT

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow


def test_attach_on_the_model_accelerates_fsdp2_plugin_prepares():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "tests/accelerate_fsdp_check.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "accelerate fsdp2 checks passed on 2 ranks" in run.stdout
