"""A transport wrapper that logs every message with the round it belongs to.

    recorder = RecordingTransport(transport)      # any Transport: MPI or in-process
    sync = compressors.create("spardl", recorder, numel=n, density=0.01)
    sync.allreduce(grad)
    events = recorder.take()                      # this call's messages, then an empty log

It counts traffic exactly like the transport it wraps (the accounting lives in
:class:`~allreducers.transports.base.Transport`), so ``sync.stats`` is unchanged. The scale
simulator turns the log into predicted time under a network model; the benchmark replays it to
measure the cost of the communication alone. With ``keep_payloads=True`` the log also holds
what this rank received, and :class:`ReplayTransport` plays such a log back to a synchronizer in
a process of its own: one rank's work of a P-rank call, timed with no network and no other rank
on the machine. Nothing here knows any synchronization method.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Capabilities, Transport

__all__ = ["Event", "RecordingTransport", "ReplayTransport"]


@dataclass(frozen=True)
class Event:
    """One logged message of this rank.

    ``kind`` is ``"send"``, ``"recv"`` or ``"allreduce"``; ``round`` is the round of the current
    synchronization in which it happened (``traffic.rounds`` at that moment); ``peer`` is the
    destination or source (``None`` for an all-reduce). For an all-reduce, ``rounds`` is the
    number of rounds it is counted as and ``nbytes`` the bytes this rank is counted as sending.
    ``payload``: what a receive returned or an all-reduce produced, when the recorder keeps it.
    """

    kind: str
    round: int
    peer: int | None
    nbytes: int
    dtype: torch.dtype
    rounds: int = 1
    payload: torch.Tensor | None = field(default=None, compare=False, repr=False)


class RecordingTransport(Transport):
    """Wraps ``inner`` and logs each send, receive and all-reduce as an :class:`Event`.

    Args:
        inner: the transport that carries the messages.
        keep_payloads: log a copy of what each receive and all-reduce gave this rank.
    """

    def __init__(self, inner: Transport, keep_payloads: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.rank = inner.rank
        self.size = inner.size
        self.keep_payloads = keep_payloads
        self.events: list = []

    @property
    def capabilities(self) -> Capabilities:
        """It records one rank's calls: no creation-time collective (``compressors.agreement``).

        Its rounds are grouped where the wrapped transport's are.
        """
        grouped = self.inner.capabilities.grouped_rounds
        return Capabilities(checks_agreement=False, grouped_rounds=grouped)

    def take(self) -> list:
        """Return the events logged so far and start a new log."""
        events, self.events = self.events, []
        return events

    def isend(self, tensor, dest, tag, sized=False):
        """Log the send, then send as the base class does."""
        self._log_send(tensor, dest)
        return super().isend(tensor, dest, tag, sized)

    def _log_send(self, tensor, dest):
        nbytes = tensor.numel() * tensor.element_size()
        self.events.append(Event("send", self.traffic.rounds, dest, nbytes, tensor.dtype))

    def start_round(self, send=None, receive=None):
        """Log the send and start the round as the base class does.

        The receive is logged when :meth:`wait_recv` hands its message over.
        """
        if not self.capabilities.grouped_rounds:  # isend and irecv, logged there
            return super().start_round(send, receive)
        if send is not None:
            self._log_send(send.tensor, send.dest)
        sends, posted = super().start_round(send, receive)
        if posted is not None:
            posted = posted, receive.source, receive.dtype
        return sends, posted

    def recv(self, source, tag, dtype, device, numel=None, out=None):
        """Receive as the base class does, and log the message."""
        message = super().recv(source, tag, dtype, device, numel, out)
        return self._log_recv(message, source, dtype)

    def irecv(self, source, tag, dtype, device, numel=None, out=None):
        """Start a receive; it is logged when :meth:`wait_recv` hands the message over."""
        return super().irecv(source, tag, dtype, device, numel, out), source, dtype

    def wait_recv(self, handle):
        """Return the message, logged now (when it is handed over, as :meth:`recv` logs)."""
        inner, source, dtype = handle
        return self._log_recv(super().wait_recv(inner), source, dtype)

    def _log_recv(self, message, source, dtype):
        self.events.append(
            Event(
                "recv",
                self.traffic.rounds,
                source,
                message.numel() * message.element_size(),
                dtype,
                payload=self._copy(message),
            )
        )
        return message

    def allreduce_sum_(self, tensor):
        """Sum in place as the base class does, logged as one event."""
        return self._logged(super().allreduce_sum_, tensor)

    def allreduce_sum(self, tensor, out=None):
        """Sum as the base class does, logged as one event."""
        if out is None:  # the base class goes through allreduce_sum_, logged above
            return super().allreduce_sum(tensor)
        return self._logged(super().allreduce_sum, tensor, out)

    def _logged(self, allreduce, tensor, *out):
        """Run ``allreduce(tensor, *out)`` and log it as one event."""
        first_round, sent_before = self.traffic.rounds, self.traffic.bytes_sent
        result = allreduce(tensor, *out)
        rounds = self.traffic.rounds - first_round
        if rounds:
            self.events.append(
                Event(
                    "allreduce",
                    first_round,
                    None,
                    self.traffic.bytes_sent - sent_before,
                    tensor.dtype,
                    rounds,
                    payload=self._copy(result),
                )
            )
        return result

    def _copy(self, tensor: torch.Tensor):
        return tensor.detach().clone() if self.keep_payloads else None

    def abort(self, message: str) -> None:
        """Abort the wrapped transport's group."""
        self.inner.abort(message)

    def _isend(self, tensor, dest, tag):
        return self.inner._isend(tensor, dest, tag)

    def _recv(self, source, tag, dtype, device):
        return self.inner._recv(source, tag, dtype, device)

    def _isend_sized(self, tensor, dest, tag):
        return self.inner._isend_sized(tensor, dest, tag)

    def _start_round(self, send, receive):
        return self.inner._start_round(send, receive)

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        return self.inner._recv_sized(source, tag, dtype, device, numel, out)

    def _waitall(self, handles):
        return self.inner._waitall(handles)

    def _irecv(self, source, tag, dtype, device):
        return self.inner._irecv(source, tag, dtype, device)

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        return self.inner._irecv_sized(source, tag, dtype, device, numel, out)

    def _wait_recv(self, handle):
        return self.inner._wait_recv(handle)

    def _allreduce_sum(self, tensor):
        return self.inner._allreduce_sum(tensor)

    def _allreduce_sum_into(self, tensor, out):
        return self.inner._allreduce_sum_into(tensor, out)

    def _barrier(self):
        return self.inner._barrier()


class ReplayTransport(Transport):
    """Plays one rank's recorded call back to a synchronizer with the same state.

    Receives and all-reduces return the recorded payloads in order, sends go nowhere. Traffic
    is counted as live. :meth:`rewind` starts the call over. A request that does not match the
    recording (another peer, message kind or dtype: the synchronizer's state or gradient
    differs from the recorded call) raises ``ValueError``.

    Args:
        events: the events of a ``RecordingTransport(..., keep_payloads=True)``.
        rank: the recorded rank.
        size: the recorded group's size.

    Raises:
        ValueError: the events hold no payloads.
    """

    #: Records or replays one rank's calls: no creation-time collective (compressors.agreement).
    capabilities = Capabilities(checks_agreement=False)

    def __init__(self, events: list, rank: int, size: int) -> None:
        super().__init__()
        self.rank = rank
        self.size = size
        self._replies = [e for e in events if e.kind != "send"]
        if any(e.payload is None for e in self._replies):
            raise ValueError("the events hold no payloads: record with keep_payloads=True")
        self._next = 0

    def rewind(self) -> None:
        """Start the recorded call over from its first receive."""
        self._next = 0

    def abort(self, message: str) -> None:
        """Raise ``RuntimeError``: a replay has no group to end."""
        raise RuntimeError(message)

    def _reply(self, kind: str, peer, dtype) -> torch.Tensor:
        if self._next == len(self._replies):
            raise ValueError(
                f"replay of rank {self.rank}: a {kind} from {peer} beyond the recording"
            )
        event = self._replies[self._next]
        if (event.kind, event.peer, event.dtype) != (kind, peer, dtype):
            raise ValueError(
                f"replay of rank {self.rank}: asked for a {kind} of {dtype} from {peer}, "
                f"recorded a {event.kind} of {event.dtype} from {event.peer}"
            )
        self._next += 1
        return event.payload

    def _isend(self, tensor, dest, tag):
        return None

    def _recv(self, source, tag, dtype, device):
        return self._reply("recv", source, dtype).to(
            device, copy=True
        )  # the method may write to it

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        """As :meth:`_recv`; the copy goes into ``out`` where it fits (as a network's write)."""
        if out is None:
            return self._recv(source, tag, dtype, device)
        payload = self._reply("recv", source, dtype)
        return out.copy_(payload) if payload.shape == out.shape else payload.to(device, copy=True)

    def _waitall(self, handles):
        return None

    def _allreduce_sum(self, tensor):
        if self.size == 1:
            return tensor
        return tensor.copy_(self._reply("allreduce", None, tensor.dtype))

    def _barrier(self):
        return None
