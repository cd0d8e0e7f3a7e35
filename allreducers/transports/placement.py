"""Placing one host's ranks on its cores and devices: torch's thread count and the CUDA device.

A host's ranks are counted by host name (``MPI.Get_processor_name``, gathered from all ranks):
this rank's local rank is its index among the ranks of the same name, the local size their
count. ``Split_type(COMM_TYPE_SHARED)`` would be the MPI way, but it counts the ranks that share
memory, and MPI settings change that: MPICH's ``MPIR_CVAR_NOLOCAL=1``, which a shaped network
needs so that ranks talk TCP, makes every rank look alone on its host. Each rank would then take
all the host's cores, and P ranks would run P times too many spinning OpenMP threads.
"""

import os

import torch
from mpi4py import MPI

__all__ = ["host_ranks", "thread_count", "place_rank"]


def host_ranks(comm, host=None):
    """Return ``(local_rank, local_size)`` of this rank among the ranks of ``comm`` on its host.

    A collective. ``host`` is this rank's host name, ``MPI.Get_processor_name()`` by default.
    """
    names = comm.allgather(MPI.Get_processor_name() if host is None else host)
    rank = comm.Get_rank()
    same = [other for other, name in enumerate(names) if name == names[rank]]
    return same.index(rank), len(same)


def thread_count(local_size, cores=None, environ=None):
    """Return the torch threads for one of ``local_size`` ranks on a host.

    The host's ``cores`` (the CPUs this process may run on, by default) shared evenly, at least
    one, and at most an explicit ``OMP_NUM_THREADS`` of ``environ`` (``os.environ`` by
    default). That variable is read as OpenMP reads it: the first number of a comma-separated
    list, ignored unless a positive integer.
    """
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    threads = max(1, cores // local_size)
    first = (
        (os.environ if environ is None else environ)
        .get("OMP_NUM_THREADS", "")
        .split(",")[0]
        .strip()
    )
    if first.isdigit() and int(first) >= 1:
        threads = min(threads, int(first))
    return threads


def place_rank(comm, device):
    """Set torch's CPU threads (:func:`thread_count`) and return this rank's ``torch.device``.

    A collective. ``device`` is ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``; CUDA
    ranks on one host use its devices round-robin by local rank (:func:`host_ranks`).
    """
    local_rank, local_size = host_ranks(comm)
    torch.set_num_threads(thread_count(local_size))
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
