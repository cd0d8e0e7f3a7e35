"""The core under a real ``mpiexec``: invariants on P ranks, and one failing rank ends the job."""

import time

import pytest

from tests.mpirun import mpiexec

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("workers", [2, 3, 4, 5, 6, 8])
def test_invariants_under_mpiexec(workers):
    run = mpiexec(workers, "tests/mpi_check_core.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"passed on {workers} ranks" in run.stdout


def test_one_failing_rank_ends_the_job_quickly():
    start = time.monotonic()
    run = mpiexec(3, "tests/mpi_crash.py", timeout=60)
    assert run.returncode != 0
    assert (
        "NaN or inf" in run.stderr and "[rank 1] uncaught exception, aborting the job" in run.stderr
    )
    assert time.monotonic() - start < 30
