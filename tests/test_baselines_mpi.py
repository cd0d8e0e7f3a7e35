"""The baselines under a real ``mpiexec``: invariants on P ranks (tests/mpi_check_baselines.py)."""

import pytest

from tests.mpirun import mpiexec

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("workers", [3, 4, 6, 8])
def test_baselines_under_mpiexec(workers):
    run = mpiexec(workers, "tests/mpi_check_baselines.py", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"passed on {workers} ranks" in run.stdout
