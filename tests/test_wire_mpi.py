"""Byte accounting under a real ``mpiexec``: counted = sent (tests/mpi_check_wire.py)."""

import pytest

from tests.mpirun import mpiexec

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("workers", [3, 4])
def test_bytes_counted_are_the_bytes_sent_under_mpiexec(workers):
    run = mpiexec(workers, "tests/mpi_check_wire.py", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"bytes counted = bytes sent on {workers} ranks" in run.stdout
