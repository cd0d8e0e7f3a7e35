"""A transport wrapper that logs every message with the round it belongs to.

    recorder = RecordingTransport(transport)      # any Transport: MPI or in-process
    sync = compressors.create("spardl", recorder, numel=n, density=0.01)
    sync.allreduce(grad)
    events = recorder.take()                      # this call's messages, then an empty log

It counts traffic exactly like the transport it wraps (the accounting lives in
:class:`~comm.base.Transport`), so ``sync.stats`` is unchanged. The scale simulator turns the log
into predicted time under a network model; the benchmark replays it to measure the cost of the
communication alone. Nothing here knows any synchronization method.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Transport


@dataclass(frozen=True)
class Event:
    """One logged message of this rank.

    ``kind`` is ``"send"``, ``"recv"`` or ``"allreduce"``; ``round`` is the round of the current
    synchronization in which it happened (``traffic.rounds`` at that moment); ``peer`` is the
    destination or source (``None`` for an all-reduce). For an all-reduce, ``rounds`` is the
    number of rounds it is counted as and ``nbytes`` the bytes this rank is counted as sending.
    """

    kind: str
    round: int
    peer: int | None
    nbytes: int
    dtype: torch.dtype
    rounds: int = 1


class RecordingTransport(Transport):
    """Wraps ``inner`` and logs each send, receive and all-reduce as an :class:`Event`."""

    def __init__(self, inner: Transport) -> None:
        super().__init__()
        self.inner = inner
        self.rank = inner.rank
        self.size = inner.size
        self.events: list = []

    def take(self) -> list:
        """Return the events logged so far and start a new log."""
        events, self.events = self.events, []
        return events

    def isend(self, tensor, dest, tag):
        self.events.append(Event("send", self.traffic.rounds, dest,
                                 tensor.numel() * tensor.element_size(), tensor.dtype))
        return super().isend(tensor, dest, tag)

    def recv(self, source, tag, dtype, device):
        message = super().recv(source, tag, dtype, device)
        self.events.append(Event("recv", self.traffic.rounds, source,
                                 message.numel() * message.element_size(), dtype))
        return message

    def allreduce_sum_(self, tensor):
        first_round, sent_before = self.traffic.rounds, self.traffic.bytes_sent
        result = super().allreduce_sum_(tensor)
        rounds = self.traffic.rounds - first_round
        if rounds:
            self.events.append(Event("allreduce", first_round, None,
                                     self.traffic.bytes_sent - sent_before, tensor.dtype, rounds))
        return result

    def abort(self, message: str) -> None:
        """Abort the wrapped transport's group."""
        self.inner.abort(message)

    def _isend(self, tensor, dest, tag):
        return self.inner._isend(tensor, dest, tag)

    def _recv(self, source, tag, dtype, device):
        return self.inner._recv(source, tag, dtype, device)

    def _waitall(self, handles):
        return self.inner._waitall(handles)

    def _allreduce_sum(self, tensor):
        return self.inner._allreduce_sum(tensor)

    def _barrier(self):
        return self.inner._barrier()
