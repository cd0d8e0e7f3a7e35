"""Run under ``mpiexec``: rank 1 fails in the middle of a collective; the job must end quickly."""
import os
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import compressors  # noqa: E402
from comm.mpi import abort_on_uncaught_exception  # noqa: E402

abort_on_uncaught_exception()
world = MPI.COMM_WORLD
sync = compressors.create("spardl", world, numel=1000, density=0.01)
if world.Get_rank() == 1:
    raise RuntimeError("deliberate failure on rank 1")
sync.allreduce(torch.randn(1000))
