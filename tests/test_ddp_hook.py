"""The DDP communication hook under torchrun with Gloo on CPU."""

import os
import subprocess
import sys

import pytest

from compressors.ddp import SparDLState
from tests.mpirun import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [2, 3])
def test_hook_matches_ddp_and_keeps_ranks_identical(workers):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={workers}",
            "tests/ddp_check.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"passed on {workers} ranks" in run.stdout


def test_state_rejects_bad_options_before_touching_the_network():
    with pytest.raises(ValueError, match="unknown synchronization method"):
        SparDLState(method="nope")
    with pytest.raises(ValueError, match="density"):
        SparDLState(density=2.0)


def test_state_built_before_the_group_starts_looks_it_up_at_first_use():
    """Lightning builds ``ddp_comm_state`` before it starts the process group."""
    state = SparDLState(density=0.1, method="spardl", teams=1)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        state.take_stats()
