"""Rank 0 sends ``sys.argv[1]`` bytes to rank 1 twice (the first warms the connection up) and
prints the seconds of the second Send, acknowledged by a one-byte reply."""

import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
payload = np.zeros(int(sys.argv[1]), dtype=np.uint8)
for _ in range(2):
    comm.Barrier()
    started = time.perf_counter()
    if comm.Get_rank() == 0:
        comm.Send(payload, dest=1)
        comm.Recv(payload[:1], source=1)
    else:
        comm.Recv(payload, source=0)
        comm.Send(payload[:1], dest=0)
    seconds = time.perf_counter() - started
if comm.Get_rank() == 0:
    print(seconds, flush=True)
