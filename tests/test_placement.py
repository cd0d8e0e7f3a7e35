"""Rank placement: a host's ranks are counted by host name, so no MPI setting can hide them."""

import os
import subprocess
import sys

import pytest
import torch
from mpirun import BIN, ROOT

from allreducers.transports import placement


class NamedRanks:
    """A stand-in communicator whose ranks run on the hosts ``names`` (this one is ``rank``)."""

    def __init__(self, names, rank):
        self.names, self.rank = names, rank

    def allgather(self, value):
        assert value == self.names[self.rank]
        return list(self.names)

    def Get_rank(self):
        return self.rank


HOSTS = ["a", "b", "a", "c", "a", "b"]


@pytest.mark.parametrize(
    "rank, expected", [(0, (0, 3)), (2, (1, 3)), (4, (2, 3)), (1, (0, 2)), (5, (1, 2)), (3, (0, 1))]
)
def test_local_rank_is_the_index_among_ranks_of_the_same_host(rank, expected):
    assert placement.host_ranks(NamedRanks(HOSTS, rank), host=HOSTS[rank]) == expected


def test_host_name_defaults_to_the_processor_name(monkeypatch):
    monkeypatch.setattr(placement.MPI, "Get_processor_name", lambda: "b")
    assert placement.host_ranks(NamedRanks(HOSTS, 5)) == (1, 2)


@pytest.mark.parametrize(
    "local_size, cores, omp, threads",
    [
        (1, 8, None, 8),
        (3, 8, None, 2),
        (16, 8, None, 1),  # cores shared evenly, at least one
        (1, 8, "1", 1),
        (2, 8, "3", 3),
        (2, 8, "6", 4),  # OMP_NUM_THREADS caps, never raises
        (1, 8, "2,1", 2),  # a nested list: its first level
        (1, 8, "0", 8),
        (1, 8, "many", 8),
        (1, 8, "", 8),  # not a positive integer: no cap
    ],
)
def test_threads_share_the_cores_capped_by_omp_num_threads(local_size, cores, omp, threads):
    environ = {} if omp is None else {"OMP_NUM_THREADS": omp}
    assert placement.thread_count(local_size, cores, environ) == threads


def test_place_rank_sets_torch_threads_from_the_host_count(monkeypatch):
    monkeypatch.setattr(placement.MPI, "Get_processor_name", lambda: "a")
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        assert placement.place_rank(NamedRanks(HOSTS, 2), "cpu") == torch.device("cpu")
        assert torch.get_num_threads() == 2  # 6 cores, 3 ranks on host a
    finally:
        torch.set_num_threads(before)


# Rank 0 prints every rank's row: lines printed by several ranks can interleave mid-line.
PROBE = (
    "from mpi4py import MPI; import torch; "
    "from allreducers.transports.placement import host_ranks, place_rank; "
    "comm = MPI.COMM_WORLD; place_rank(comm, 'cpu'); "
    "rows = comm.gather((comm.Get_rank(), *host_ranks(comm), torch.get_num_threads())); "
    "lines = [' '.join(map(str, row)) for row in rows or ()]; "
    "comm.Get_rank() == 0 and print('\\n'.join(lines), flush=True)"
)


@pytest.mark.mpi
@pytest.mark.parametrize("omp", [None, "1"])
def test_ranks_hidden_from_each_other_by_nolocal_are_still_counted(omp):
    """With ``MPIR_CVAR_NOLOCAL=1`` every rank is alone in its shared-memory group; the host's
    ranks are counted all the same, and an explicit OMP_NUM_THREADS=1 is kept."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env.update(
        MPIR_CVAR_NOLOCAL="1",
        MPIR_CVAR_POLLS_BEFORE_YIELD="1",
        MPIR_CVAR_ENABLE_HEAVY_YIELD="1",
        PYTHONPATH=ROOT,
        **({} if omp is None else {"OMP_NUM_THREADS": omp}),
    )
    result = subprocess.run(
        [os.path.join(BIN, "mpiexec"), "-n", "2", sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = sorted(
        tuple(map(int, line.split())) for line in result.stdout.split("\n") if line.strip()
    )
    threads = 1 if omp else max(1, len(os.sched_getaffinity(0)) // 2)
    assert rows == [(0, 0, 2, threads), (1, 1, 2, threads)]
