"""The benchmark's reference rows (``floor`` and ``floor+ef``).

What any method must at least spend, SparDL's messages with no method work.

The **floor** replays SparDL's messages (same sizes, partners and rounds, with d = 1) through
the transport with no selection, packing or accumulation, plus one ``Selector.topk`` pass over
the n gradient entries of this rank. The **floor+ef** row adds to it the error-feedback work
that every method with a residual and a dense result does, whatever it exchanges: its selection
pass also adds the gradient into a residual kept across calls (as SparDL's cuts do), and the
call zeroes the result, writes the k chosen values / P into it and zeroes them in the residual.
"""

from __future__ import annotations

import time

import torch

import compressors
from allreducers.transports.recording import RecordingTransport
from compressors.sparse_ops import budget, put_, zero_

from .timing import settle

__all__ = ["FLOOR", "EF_FLOOR", "FLOORS", "FLOOR_RUNS", "FloorRun", "spardl_events"]

FLOOR = "floor"
EF_FLOOR = "floor+ef"
FLOORS = {FLOOR: False, EF_FLOOR: True}  # the last rows, after the methods': error feedback?
FLOOR_RUNS = [(label, label, {}) for label in FLOORS]


class FloorRun:
    """The floor: SparDL's messages replayed with no method work.

    The messages (``events``, as a :class:`RecordingTransport` logs them) go through ``transport``
    after one exact top-k selection over this rank's n entries (under a key, as the methods'
    selections are: from the thresholds remembered from the last call).

    ``error_feedback``: the ``floor+ef`` row (module docstring): the selection is from a
    residual kept across calls plus the gradient, added in the same pass, and the call writes
    the dense result into ``out``.
    """

    def __init__(
        self, transport, events: list, numel: int, density: float, error_feedback: bool = False
    ) -> None:
        self.transport = transport
        self.events = events
        self.selector = compressors.Selector()
        self.k = budget(numel, density)
        self.residual = torch.zeros(numel) if error_feedback else None
        self.sends = [
            (
                e,
                torch.zeros(
                    e.nbytes // torch.empty((), dtype=e.dtype).element_size(), dtype=e.dtype
                ),
            )
            for e in self.events
            if e.kind == "send"
        ]
        self.rounds = max([e.round + e.rounds for e in self.events], default=0)
        self.device = torch.device("cpu")  # where the residual and messages are (:meth:`to`)

    def to(self, device: torch.device) -> None:
        """Keep the residual and the messages on ``device`` (a GPU's gradients: the GPU)."""
        self.device = device
        if self.residual is not None:
            self.residual = self.residual.to(device)
        self.sends = [(event, buffer.to(device)) for event, buffer in self.sends]

    def local_work(self, grad: torch.Tensor, out: torch.Tensor) -> tuple:
        """This rank's work besides the messages; its seconds of selection and of accumulation."""
        if grad.device != self.device:
            self.to(grad.device)
        start = time.perf_counter()
        if self.residual is None:
            self.selector.topk(grad, self.k, key="gradient")
            return time.perf_counter() - start, 0.0
        columns, values = self.selector.select(self.residual, self.k, grad, key="residual")
        selected = time.perf_counter()
        put_(zero_(out), columns, values / self.transport.size)
        put_(self.residual, columns, 0.0)
        return selected - start, time.perf_counter() - selected

    def state(self):
        """What carries across calls and :meth:`restore` takes (the residual, or ``None``)."""
        return None if self.residual is None else self.residual.clone()

    def restore(self, state) -> None:
        """Go back to a :meth:`state`."""
        if state is not None:
            self.residual.copy_(state)

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One replay after the local work on ``grad``; a record like ``MethodRun.time``'s."""
        settle(grad)
        self.transport.barrier()
        start = time.perf_counter()
        select, accumulate = self.local_work(grad, out)
        sent = time.perf_counter()
        for number in range(self.rounds):
            handles = [
                self.transport.isend(buffer, e.peer, number)
                for e, buffer in self.sends
                if e.round == number
            ]
            for e in self.events:
                if e.kind == "recv" and e.round == number:
                    self.transport.recv(e.peer, number, e.dtype, grad.device)
            self.transport.waitall(handles)
        settle(out)
        end = time.perf_counter()
        return {
            "seconds": end - start,
            "select": select,
            "comm": end - sent,
            "accumulate": accumulate,
            "bytes": sum(e.nbytes for e, _ in self.sends),
            "messages": len(self.sends),
            "rounds": self.rounds,
            "host_syncs": 0,
            "nnz": self.k,
            "cosine": None,
        }


def spardl_events(transport, source, density: float) -> list:
    """The messages of one SparDL call (d = 1) on a fresh synchronizer, for the floor."""
    recorder = RecordingTransport(transport)
    compressors.create("spardl", recorder, numel=source.numel, density=density).allreduce(
        source.get(transport.rank, 0)
    )
    return recorder.take()
