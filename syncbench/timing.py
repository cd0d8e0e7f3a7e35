"""Timing synchronizations.

One row's synchronizer timed call by call (:class:`MethodRun`), many rows interleaved call by call
(:func:`time_runs`), and the exact average each result is compared with.
"""

from __future__ import annotations

import time

import torch

import compressors
from compressors.sparse_ops import count_nonzero

__all__ = ["PHASES", "settle", "MethodRun", "time_runs", "mpi_gradients", "cosine"]

PHASES = ("select", "comm", "accumulate")


def settle(tensor: torch.Tensor) -> None:
    """Wait for the work queued on ``tensor``'s GPU (nothing on the CPU).

    A clock read after it counts the device's work, not only its launch.
    """
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


class MethodRun:
    """One row's synchronizer on this rank, timed one call at a time.

    ``lost_mass``: for a method that can measure what it loses (an option ``measure_loss``,
    gTop-k's), create it measuring and record ``lost_mass`` after each call, once the clock has
    stopped: the measurement's own all-reduce is never timed.
    """

    def __init__(
        self,
        transport,
        name: str,
        options: dict,
        numel: int,
        density: float,
        lost_mass: bool = False,
    ) -> None:
        self.measures_loss = lost_mass and "measure_loss" in compressors.options(name)
        extra = {"measure_loss": True} if self.measures_loss else {}
        self.sync = compressors.create(
            name, transport, numel=numel, density=density, **options, **extra
        )
        self.sync.count_nnz = False  # counted below, once the clock has stopped

    def restore(self, state: dict) -> None:
        """Go back to the synchronizer's ``state_dict`` ``state``."""
        self.sync.load_state_dict(state)

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One synchronization of ``grad``.

        The wall time and phase times in seconds, traffic, nnz, the cosine to ``exact`` and, when
        measured, ``lost_mass``. The synchronizer counts no non-zeros in its call (``count_nnz``
        off): nnz is counted here, after the clock.
        """
        settle(grad)
        self.sync.transport.barrier()
        start = time.perf_counter()
        result = self.sync.allreduce(grad, out=out)
        settle(result)
        seconds = time.perf_counter() - start
        stats = self.sync.stats
        record = {
            "seconds": seconds,
            **{p: stats["seconds"].get(p, 0.0) for p in PHASES},
            "bytes": stats["bytes_sent"],
            "messages": stats["messages"],
            "rounds": stats["rounds"],
            "host_syncs": stats["host_syncs"],
            "nnz": count_nonzero(result),
            "cosine": cosine(result, exact),
        }
        if self.measures_loss:
            record["lost_mass"] = float(self.sync.measure_lost_mass()["lost_mass"])
        return record


def time_runs(factories: list, gradient, calls: int, sequential: bool) -> list:
    """Per-call records of every run, in the order of ``factories``.

    ``factories``: functions that build a :class:`MethodRun`, a floor run or a replayed run,
    anything with ``time(grad, exact, out)``; ``gradient(call)`` gives this rank's gradient of call
    ``call`` and the exact average.

    Interleaved (the default): call c of every run synchronizes the same gradient one after
    another, starting at a different run each call, so a machine that drifts in speed during
    the benchmark slows every run alike. ``sequential``: all calls of one run, then the next
    (one run's buffers in memory at a time).
    """
    out = torch.empty_like(gradient(0)[0])
    records = [[] for _ in factories]
    if sequential:
        for index, factory in enumerate(factories):
            run = factory()
            records[index] = [run.time(*gradient(call), out) for call in range(calls)]
            del run
        return records
    runs = [factory() for factory in factories]
    for call in range(calls):
        for index in [(call + shift) % len(runs) for shift in range(len(runs))]:
            records[index].append(runs[index].time(*gradient(call), out))
    return records


def mpi_gradients(comm, source):
    """``gradient(call)`` for :func:`time_runs` under MPI.

    This rank's gradient of the call and the exact average over the ranks (one MPI all-reduce per
    call, cached for the rows).
    """
    from mpi4py import MPI

    cache = {}

    def gradient(call: int) -> tuple:
        if call not in cache:
            cache.clear()
            grad = source.get(comm.Get_rank(), call)
            exact = grad.clone()
            comm.Allreduce(MPI.IN_PLACE, exact.numpy(), op=MPI.SUM)
            cache[call] = grad, exact.div_(comm.Get_size())
        return cache[call]

    return gradient


def cosine(result: torch.Tensor, exact: torch.Tensor) -> float:
    """Cosine similarity of two vectors, computed in float64.

    1.0 when both are zero, 0.0 when only one is, NaN when either holds NaN or inf.
    """
    a, b = result.double(), exact.double()
    norm_a, norm_b = float(a.norm()), float(b.norm())
    if norm_a == 0 or norm_b == 0:
        return float(norm_a == norm_b)
    return float(a.dot(b)) / (norm_a * norm_b)
