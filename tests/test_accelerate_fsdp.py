"""attach with accelerate's FSDP2 plugin: 2 CPU processes under torchrun (Gloo)."""

import pytest

from tests.mpirun import torchrun

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow


def test_attach_on_the_model_accelerates_fsdp2_plugin_prepares():
    run = torchrun(2, "tests/accelerate_fsdp_check.py", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "accelerate fsdp2 checks passed on 2 ranks" in run.stdout
