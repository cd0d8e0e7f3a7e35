"""Every method over MPI on CUDA gradients (tests/mpi_cuda_check.py): runs where a GPU is."""

import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_every_method_over_mpi_on_cuda_matches_the_cpu(workers):
    run = mpiexec(workers, "tests/mpi_cuda_check.py", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "mpi cuda checks passed" in run.stdout
