"""Record and replay.

One rank's share of a call timed alone in this process, free of the network and of other ranks
competing for the cores and memory.

Every row's call number ``warmup`` is recorded on P in-process ranks
(``allreducers.transports.recording``), then rank 0's share of it is timed in this process, its
received messages played back, its state restored before each call, and its result checked
against the recorded one.
"""

from __future__ import annotations

import functools

import torch

import compressors
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport, ReplayTransport

from .floor import FLOORS, FloorRun
from .timing import MethodRun

__all__ = ["Replayed", "record_call", "replay_method", "replay_runs"]


class Replayed:
    """A run on a :class:`ReplayTransport`, started over before every call.

    A :class:`MethodRun` or :class:`FloorRun`: before every call the transport is rewound and the
    run's state is as before the recorded call (``state``: a synchronizer's ``state_dict``, a
    floor's :meth:`FloorRun.state`); a method's result must equal the recorded one (``result``).
    """

    def __init__(
        self, run, transport: ReplayTransport, state=None, result: torch.Tensor = None
    ) -> None:
        self.run, self.transport, self.state, self.result = run, transport, state, result

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One replayed call; raises ``RuntimeError`` if it does not repeat the recorded one."""
        self.transport.rewind()
        self.run.restore(self.state)
        record = self.run.time(grad, exact, out)
        if self.result is not None and not torch.equal(out, self.result):
            raise RuntimeError(f"the replay of {self.run.sync.name} differs from the recorded call")
        return record


def record_call(name: str, options: dict, grads: list, density: float, group=None) -> tuple:
    """Run ``name`` on in-process ranks and record rank 0's last call.

    The ranks are ``len(grads[0])`` (``group``, by default ``allreducers.transports.local_group``),
    ``grads[c][r]`` being rank r's gradient at call c. Returns rank 0's state before its last call,
    its events (with payloads) and its result.
    """

    def body(transport):
        recorder = RecordingTransport(transport, keep_payloads=True)
        sync = compressors.create(
            name, recorder, numel=grads[0][0].numel(), density=density, **options
        )
        for call in grads[:-1]:
            sync.allreduce(call[transport.rank])
        recorder.take()
        state = sync.state_dict()
        result = sync.allreduce(grads[-1][transport.rank])
        return (state, recorder.take(), result) if transport.rank == 0 else None

    return (group or local_group(len(grads[0]))).run(body)[0]


def replay_method(name: str, options: dict, grads: list, density: float, group=None) -> Replayed:
    """Rank 0's last call of ``grads`` (:func:`record_call`), ready to be replayed alone."""
    state, events, result = record_call(name, options, grads, density, group)
    transport = ReplayTransport(events, 0, len(grads[0]))
    return Replayed(
        MethodRun(transport, name, options, grads[0][0].numel(), density), transport, state, result
    )


def replay_runs(runs: list, source, workers: int, warmup: int, density: float) -> tuple:
    """``(factories, gradient)`` for ``timing.time_runs``.

    Each of ``runs`` (``(label, name, options)``, then the two floors) with its call number
    ``warmup`` recorded on ``workers`` in-process ranks, then replayed as rank 0 alone; the floors
    replay SparDL's (d = 1) messages of that call, floor+ef from the residual its local work left
    after the calls before.
    """
    grads = [[source.get(rank, call) for rank in range(workers)] for call in range(warmup + 1)]
    exact = torch.stack(grads[-1]).mean(0)

    spardl_call = functools.cache(lambda: record_call("spardl", {}, grads, density)[1])

    def floor(error_feedback: bool) -> Replayed:
        events = spardl_call()
        transport = ReplayTransport(events, 0, workers)
        run = FloorRun(transport, events, source.numel, density, error_feedback)
        scratch = torch.empty(source.numel, device=grads[0][0].device)
        for call in grads[:-1]:
            run.local_work(call[0], scratch)
        return Replayed(run, transport, run.state())

    # Each row is recorded when it is built: with --sequential one row's recording at a time.
    factories = [
        lambda name=name, options=options: replay_method(name, options, grads, density)
        for _, name, options in runs
    ]
    factories += [lambda feedback=feedback: floor(feedback) for feedback in FLOORS.values()]
    return factories, lambda call: (grads[-1][0], exact)
