"""The DDP hook and the FSDP seams in Lightning: 2 CPU processes under torchrun (Gloo)."""

import pytest

from tests.mpirun import torchrun

pytest.importorskip("pytorch_lightning")
pytestmark = pytest.mark.slow


def test_the_hook_and_the_fsdp_seams_in_lightning_on_the_cpu():
    run = torchrun(2, "tests/lightning_cpu_check.py", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "lightning cpu checks passed on 2 ranks" in run.stdout
