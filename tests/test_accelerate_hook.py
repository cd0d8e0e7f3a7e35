"""The hook with Hugging Face accelerate: 2 CPU processes, registered on the prepared model."""

import pytest

from tests.mpirun import torchrun

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow


def test_hook_on_the_model_accelerate_prepares():
    run = torchrun(2, "tests/accelerate_check.py", timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "accelerate hook checks passed on 2 ranks" in run.stdout
