"""Run under ``mpiexec``: rank 1 fails in the middle of a collective; the job must end quickly.

The script installs no exception hook of its own: creating a synchronizer on an MPI
communicator does (as a library user's program would rely on)."""

import torch
from mpi4py import MPI

import compressors

world = MPI.COMM_WORLD
sync = compressors.create("spardl", world, numel=1000, density=0.01)
grad = torch.randn(1000)
if world.Get_rank() == 1:
    grad[123] = float("nan")  # the selection refuses it, after the other ranks have started
sync.allreduce(grad)
