"""The transport interface every schedule runs on, and its traffic accounting.

A transport moves 1-D tensors between ranks. Schedules only need three primitives (a non-blocking
send, a receive of a message whose size the sender decides, blocking or started early and waited
for later, and a wait for sends) plus a dense sum all-reduce for the ``dense`` method. Every
transport counts the traffic it carries the same way, in a :class:`Traffic` record, so byte and
round counts never depend on the transport.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "Traffic",
    "Capabilities",
    "Outgoing",
    "Incoming",
    "PendingReceive",
    "PendingSizedReceive",
    "PostedReceive",
    "Transport",
]


class Capabilities(NamedTuple):
    """What a transport can do: the layers above ask it this, never test its type.

    Attributes:
        tag_bound: the largest tag its library accepts (``None``: no bound known).
        device_memory: it moves device (CUDA) tensors itself, without staging them through the
            host (a CUDA-aware MPI, NCCL, the in-process transport's references).
        posted_receives: ``irecv`` posts the receive at once, so a sender that waits for its
            receiver (a rendezvous) is not held back until the receive is waited for.
        grouped_rounds: :meth:`Transport.start_round` hands a round's send and receive to the
            library as one group (torch.distributed's ``batch_isend_irecv``: NCCL's grouped
            point-to-point), so that neither waits behind the other on the peer's stream.
        checks_agreement: a synchronizer created on it runs the one small collective that
            compares the ranks' settings (``compressors.agreement``); a recording or a replay of
            one rank's calls does not.
        rendezvous: a send completes only once its receive is posted (the in-process
            transport's ``rendezvous=True``; NCCL and MPI's large messages behave so too, but
            their transports say nothing they cannot promise for every message).
    """

    tag_bound: int | None = None
    device_memory: bool = False
    posted_receives: bool = False
    grouped_rounds: bool = False
    checks_agreement: bool = True
    rendezvous: bool = False


@dataclass
class Traffic:
    """Traffic one rank generated: payload bytes sent, messages sent, communication rounds.

    A *round* is one step of a schedule on its critical path; every rank counts every step of
    the collectives it joins, including steps in which it happens to have nothing to send.
    ``host_syncs``: the times the transport itself waited for a GPU (staging device tensors
    through the host for an MPI that is not CUDA-aware); 0 on the CPU.
    """

    bytes_sent: int = 0
    messages: int = 0
    rounds: int = 0
    host_syncs: int = 0

    def reset(self) -> None:
        """Zero every counter (called at the start of each synchronization)."""
        self.bytes_sent = self.messages = self.rounds = self.host_syncs = 0


class Outgoing(NamedTuple):
    """The send of one round (:meth:`Transport.start_round`): as :meth:`Transport.isend`'s."""

    tensor: torch.Tensor
    dest: int
    tag: int
    sized: bool = False


class Incoming(NamedTuple):
    """The receive of one round (:meth:`Transport.start_round`): as :meth:`Transport.irecv`'s."""

    source: int
    tag: int
    dtype: torch.dtype
    device: torch.device
    numel: int | None = None
    out: torch.Tensor | None = None


class PendingReceive(NamedTuple):
    """A receive started by :meth:`Transport.irecv` that the library has not begun yet.

    It is done when it is waited for.
    """

    source: int
    tag: int
    dtype: torch.dtype
    device: torch.device


class PendingSizedReceive(NamedTuple):
    """A receive of known length started by :meth:`Transport.irecv`, not begun yet."""

    source: int
    tag: int
    dtype: torch.dtype
    device: torch.device
    numel: int
    out: torch.Tensor | None


class PostedReceive(NamedTuple):
    """A receive of known length the library has begun: its ``request`` and the buffer ``out``."""

    request: object
    out: torch.Tensor


class _Sized(NamedTuple):
    """The handle :meth:`Transport.irecv` returns for a receive of known length."""

    inner: object
    source: int
    numel: int


def _of_length(message: torch.Tensor, source: int, numel: int) -> torch.Tensor:
    """Return ``message``, received from ``source``; ``RuntimeError`` unless ``numel`` long."""
    if message.numel() != numel:
        raise RuntimeError(
            f"malformed message from rank {source}: {message.numel()} elements, expected {numel}"
        )
    return message


class Transport(abc.ABC):
    """One rank's view of a group: ``rank``, ``size``, point-to-point and a dense all-reduce.

    Subclasses implement ``_isend``, ``_recv``, ``_waitall`` and ``_allreduce_sum``; this class
    wraps them with accounting so that every transport counts identically.
    """

    rank: int
    size: int

    #: What this transport can do (see :class:`Capabilities`).
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.traffic = Traffic()

    def process_key(self) -> tuple:
        """Return what identifies this rank among the transports of this process.

        One communication thread serves each key. Ranks of separate processes (MPI,
        ``torch.distributed``) share one per process, whatever the communicator: one thread
        keeps their calls in one order.
        """
        return ("process",)

    def check_threads(self, what: str) -> None:  # noqa: B027 - optional, a no-op by default
        """Raise ``RuntimeError`` where this transport may not be called from a second thread.

        ``what`` names what needs it, for the message. Nothing by default.
        """

    def agreement_device(self) -> torch.device | None:
        """Where this group's small collectives run (``None``: on the host)."""
        return None

    def isend(self, tensor: torch.Tensor, dest: int, tag: int, sized: bool = False):
        """Start sending the contiguous 1-D ``tensor`` to ``dest``; return a handle.

        The buffer must stay untouched until :meth:`waitall` returns for the handle.
        ``sized``: the receiver knows the length and passes it to :meth:`recv` (``numel``), so
        a transport that must frame messages (torch.distributed) sends no length header and
        its receiver reads none back from the device.
        """
        self._count_send(tensor)
        if sized:
            return self._isend_sized(tensor, dest, tag)
        return self._isend(tensor, dest, tag)

    def _count_send(self, tensor: torch.Tensor) -> None:
        self.traffic.bytes_sent += tensor.numel() * tensor.element_size()
        self.traffic.messages += 1

    def start_round(self, send: Outgoing | None = None, receive: Incoming | None = None):
        """Post one round's send and receive together; return ``(sends, posted)``.

        ``sends``: the handles :meth:`waitall` takes (none without ``send``); ``posted``: the
        handle :meth:`wait_recv` takes (``None`` without ``receive``). The send and the receive
        are as :meth:`isend`'s and :meth:`irecv`'s, and counted the same. A transport with
        ``capabilities.grouped_rounds`` hands both to its library as one group
        (:meth:`_start_round`), so neither waits behind the other: two ranks that exchange with
        each other cannot block each other, whatever their messages' size and the library's
        buffering (NCCL orders the operations between two ranks). Elsewhere this is
        :meth:`isend`, then :meth:`irecv`.
        """
        if not self.capabilities.grouped_rounds:  # (only what was given: a subclass's
            sends, posted = [], None  # isend or irecv may take no more)
            if send is not None:
                sends.append(self.isend(*(send if send.sized else send[:3])))
            if receive is not None:
                posted = self.irecv(*(receive[:4] if receive.numel is None else receive))
            return sends, posted
        if send is not None:
            self._count_send(send.tensor)
        sends, posted = self._start_round(send, receive)
        if receive is not None and receive.numel is not None:
            posted = _Sized(posted, receive.source, receive.numel)
        return sends, posted

    def _start_round(self, send: Outgoing | None, receive: Incoming | None):
        """Post a round as one group (transports with ``grouped_rounds``; nothing counted here).

        This default starts the send, then the receive.
        """
        sends = []
        if send is not None:
            start = self._isend_sized if send.sized else self._isend
            sends.append(start(send.tensor, send.dest, send.tag))
        posted = None
        if receive is not None:
            source, tag, dtype, device, numel, out = receive
            if numel is None:
                posted = self._irecv(source, tag, dtype, device)
            else:
                posted = self._irecv_sized(source, tag, dtype, device, numel, out)
        return sends, posted

    def recv(
        self,
        source: int,
        tag: int,
        dtype: torch.dtype,
        device: torch.device,
        numel: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Receive one message from ``source`` as a 1-D tensor of ``dtype`` on ``device``.

        Its length is whatever was sent; ``numel``: the length the sender's ``isend`` promised
        with ``sized`` (its sends and these receives must agree). ``out`` (with ``numel``): a
        contiguous buffer of ``numel`` elements that a transport which can write a message
        into a given buffer receives it in (a caller's buffer reused call after call); the
        returned tensor is the message, ``out`` or not. Else a new tensor.

        Raises:
            RuntimeError: the message does not have ``numel`` elements.
        """
        if numel is None:
            return self._recv(source, tag, dtype, device)
        return _of_length(self._recv_sized(source, tag, dtype, device, numel, out), source, numel)

    def _isend_sized(self, tensor, dest, tag):
        """Send a message whose length the receiver knows (default: as any other)."""
        return self._isend(tensor, dest, tag)

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        """Receive a message of known length ``numel`` (default: as any other, ``out`` unused)."""
        return self._recv(source, tag, dtype, device)

    def irecv(
        self,
        source: int,
        tag: int,
        dtype: torch.dtype,
        device: torch.device,
        numel: int | None = None,
        out: torch.Tensor | None = None,
    ):
        """Start receiving one message from ``source`` (as :meth:`recv`); return a handle.

        :meth:`wait_recv` of the handle gives the message. Several may be outstanding, to
        several sources; receives of one source and tag are waited for in the order they were
        started. ``numel`` and ``out``: as in :meth:`recv`. Where the sender's library waits
        for the receiver before the data moves (a rendezvous: Gloo always, MPI for large
        messages), a receive started before the receiver's other work lets the data travel
        during it.
        """
        if numel is None:
            return self._irecv(source, tag, dtype, device)
        return _Sized(self._irecv_sized(source, tag, dtype, device, numel, out), source, numel)

    def wait_recv(self, handle) -> torch.Tensor:
        """Return the message of a receive started by :meth:`irecv`, once it has arrived.

        Raises:
            RuntimeError: a receive of known length got a message of another length.
        """
        if not isinstance(handle, _Sized):
            return self._wait_recv(handle)
        return _of_length(self._wait_recv(handle.inner), handle.source, handle.numel)

    def waitall(self, handles) -> None:
        """Wait until the sends behind ``handles`` have completed."""
        self._waitall(handles)

    def allreduce_sum(self, tensor: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
        """Return the element-wise sum of ``tensor`` over all ranks, the same bits on every rank.

        ``tensor`` is left as it is unless it is ``out``. Counted as :meth:`allreduce_sum_`.

        Args:
            tensor: this rank's addend.
            out: a contiguous tensor like ``tensor`` that receives the sum (``None``: a new
                one). The library reads ``tensor`` and writes ``out`` itself (MPI's out-of-place
                all-reduce): no copy of ``tensor`` into ``out`` beforehand.
        """
        if out is None:
            return self.allreduce_sum_(tensor.clone(memory_format=torch.contiguous_format))
        self._count_allreduce(out)
        return self._allreduce_sum_into(tensor, out)

    def allreduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Replace the contiguous ``tensor`` by its sum over all ranks and return it.

        The same bits on every rank. The library's algorithm is not observable, so traffic is
        counted as Rabenseifner's reduce-scatter + all-gather: 2 ceil(log2 P) rounds and
        2 (P-1)/P of the buffer sent.
        """
        self._count_allreduce(tensor)
        return self._allreduce_sum(tensor)

    def _count_allreduce(self, tensor: torch.Tensor) -> None:
        """Count one all-reduce of ``tensor`` (see :meth:`allreduce_sum_`)."""
        if self.size > 1:
            steps = 2 * math.ceil(math.log2(self.size))
            nbytes = tensor.numel() * tensor.element_size()
            self.traffic.bytes_sent += 2 * (self.size - 1) * nbytes // self.size
            self.traffic.messages += steps
            self.traffic.rounds += steps

    def _irecv(self, source, tag, dtype, device):
        """Start a receive; this default leaves it to :meth:`_wait_recv`.

        A transport whose messages travel once sent, as the in-process one's, loses nothing by
        it.
        """
        return PendingReceive(source, tag, dtype, device)

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        """Start a receive of known length; this default leaves it to :meth:`_wait_recv`."""
        return PendingSizedReceive(source, tag, dtype, device, numel, out)

    def _wait_recv(self, handle):
        if isinstance(handle, PendingSizedReceive):
            return self._recv_sized(*handle)
        return self._recv(*handle)

    def _allreduce_sum_into(self, tensor, out):
        """Sum ``tensor`` over all ranks into ``out``; this default copies, then sums in place."""
        if out.data_ptr() != tensor.data_ptr():
            out.copy_(tensor)
        return self._allreduce_sum(out)

    def barrier(self) -> None:
        """Block until every rank has reached this call."""
        self._barrier()

    @abc.abstractmethod
    def abort(self, message: str) -> None:
        """End the whole group (every rank) because this rank failed with ``message``."""

    @abc.abstractmethod
    def _isend(self, tensor, dest, tag): ...

    @abc.abstractmethod
    def _recv(self, source, tag, dtype, device): ...

    @abc.abstractmethod
    def _waitall(self, handles): ...

    @abc.abstractmethod
    def _allreduce_sum(self, tensor):
        """Sum ``tensor`` over all ranks in place."""

    @abc.abstractmethod
    def _barrier(self): ...
