"""An in-process group: P ranks as threads of one process, exchanging tensors through mailboxes.

Tests and the scale simulator run the very same schedule code on it as under ``mpiexec``, and it
counts traffic exactly as the MPI transport does (the accounting lives in :class:`Transport`).

    >>> from allreducers.transports import local_group
    >>> local_group(4).run(lambda t: t.rank * 10)
    [0, 10, 20, 30]

By default a send completes at once (the message is buffered, as MPI's eager sends are).
``local_group(P, rendezvous=True)`` models the libraries that buffer nothing, NCCL's
point-to-point and MPI's large messages: a send completes (:meth:`Transport.waitall` returns
for it) only once its receive has been posted (``irecv``, or ``recv``), so a schedule whose
ranks each wait for a send before posting the receive that matches the other's fails with a
``TimeoutError`` naming the send, instead of working by luck of buffering. The data and the
bits are the same in both modes.

``local_group(P, ordered=True)`` adds NCCL's ordering to the rendezvous: the operations of a rank
with one peer run in the order they were posted, each once the one before it is complete, unless
they were posted as one group (:meth:`Transport.start_round`). Two ranks that each post a send
to the other and then, apart from it, the receive, wait for each other forever under NCCL once
messages outgrow its buffers; here that fails with a ``TimeoutError``. (A rank here waits on its
thread where NCCL would wait on its stream: a stricter model, never a looser one.)
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from typing import Callable

from .base import Capabilities, Transport

__all__ = ["GroupAborted", "LocalGroup", "local_group", "LocalTransport"]


class GroupAborted(RuntimeError):
    """Raised on the ranks of an in-process group after another rank failed."""


class LocalGroup:
    """Shared state of an in-process group; :meth:`run` executes a function on every rank."""

    def __init__(
        self, size: int, timeout: float = 300.0, rendezvous: bool = False, ordered: bool = False
    ) -> None:
        if size < 1:
            raise ValueError(f"group size must be >= 1, got {size}")
        self.size = size
        self.timeout = timeout
        self.rendezvous = rendezvous or ordered
        self.ordered = ordered
        # Rendezvous mode: per (source, dest, tag), messages sent and receives posted so far.
        self._sent: dict = defaultdict(int)
        self._posted: dict = defaultdict(int)
        self._matched = threading.Condition()
        self._mailboxes: dict = defaultdict(queue.Queue)
        self._lock = threading.Lock()
        self._aborted = threading.Event()
        self._barrier = threading.Barrier(size)

    def rank(self, rank: int) -> LocalTransport:
        """The transport of rank ``rank`` (call it from the thread that plays that rank)."""
        return LocalTransport(self, rank)

    def mailbox(self, source: int, dest: int, tag: int) -> queue.Queue:
        """The FIFO queue carrying messages from ``source`` to ``dest`` with ``tag``."""
        with self._lock:
            return self._mailboxes[(source, dest, tag)]

    def abort(self) -> None:
        """Make every pending and future receive or barrier on this group fail."""
        self._aborted.set()
        self._barrier.abort()
        with self._matched:
            self._matched.notify_all()

    def sent(self, key: tuple) -> int:
        """Count one more message on ``key`` (source, dest, tag); return its number (from 1)."""
        with self._matched:
            self._sent[key] += 1
            self._matched.notify_all()
            return self._sent[key]

    def post(self, key: tuple) -> int:
        """Count one more receive posted on ``key``; return its number (from 1).

        It matches the next message sent there.
        """
        with self._matched:
            self._posted[key] += 1
            self._matched.notify_all()
            return self._posted[key]

    def wait_posted(self, key: tuple, number: int, timeout: float) -> bool:
        """Wait until ``number`` receives are posted on ``key``; False after ``timeout`` s."""
        with self._matched:
            return self._matched.wait_for(
                lambda: self._posted[key] >= number or self.aborted, timeout
            )

    def wait_sent(self, key: tuple, number: int, timeout: float) -> bool:
        """Wait until ``number`` messages are sent on ``key``; False after ``timeout`` s."""
        with self._matched:
            return self._matched.wait_for(
                lambda: self._sent[key] >= number or self.aborted, timeout
            )

    @property
    def aborted(self) -> bool:
        """True once a rank has failed."""
        return self._aborted.is_set()

    def run(self, fn: Callable, *args, **kwargs) -> list:
        """Run ``fn(transport, *args, **kwargs)`` on every rank in its own thread.

        Returns the P results in rank order. If any rank raises, the group is aborted (so no
        rank waits forever) and the first original exception is re-raised here; an aborted group
        runs nothing more (its mailboxes may hold the failed run's messages).
        """
        if self.aborted:
            raise GroupAborted(
                "this group was aborted when a rank of an earlier run failed; "
                f"run on a new one, local_group({self.size})"
            )
        results: list = [None] * self.size
        errors: list = [None] * self.size

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self.rank(rank), *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors[rank] = exc
                self.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        originals = [e for e in errors if e is not None and not isinstance(e, GroupAborted)]
        failures = originals or [e for e in errors if e is not None]
        if failures:
            raise failures[0]
        return results


def local_group(
    size: int, timeout: float = 300.0, rendezvous: bool = False, ordered: bool = False
) -> LocalGroup:
    """Create an in-process group of ``size`` ranks (see :class:`LocalGroup`).

    ``timeout``: seconds a receive, a barrier or (``rendezvous``) a send waits before the group
    fails. ``rendezvous``: a send completes only once its receive is posted (the module).
    ``ordered``: a rendezvous in which a rank's operations with one peer also run in order,
    as NCCL's do, unless posted as one round (the module).
    """
    return LocalGroup(size, timeout, rendezvous, ordered)


class LocalTransport(Transport):
    """One thread-rank of a :class:`LocalGroup`."""

    _POLL_SECONDS = 0.05

    def __init__(self, group: LocalGroup, rank: int) -> None:
        super().__init__()
        self.group = group
        self.rank = rank
        self.size = group.size
        # Device tensors go by reference; a receive is posted when started (rendezvous mode).
        self.capabilities = Capabilities(
            device_memory=True,
            posted_receives=True,
            grouped_rounds=group.ordered,
            rendezvous=group.rendezvous,
        )
        # Ordered mode: per peer, this rank's operations not known to be complete, and whether
        # the operations being posted form one round (they then do not wait for each other).
        self._unfinished: dict = defaultdict(list)
        self._grouped = False

    def process_key(self) -> tuple:
        """Return this rank's own key: the ranks of a group are threads of one process.

        Each gets a communication thread of its own.
        """
        return ("local", id(self.group), self.rank)

    def _isend(self, tensor, dest, tag):
        self._check_peer(dest)
        self._in_order(dest)
        # The copy is the "wire": the sender may reuse its buffer once isend returns.
        self.group.mailbox(self.rank, dest, tag).put(tensor.detach().clone())
        if not self.group.rendezvous:
            return None
        key = (self.rank, dest, tag)
        handle = key, self.group.sent(key)
        self._begun(dest, "send", handle)
        return handle

    def _start_round(self, send, receive):
        """Ordered mode: the round's operations wait for those before them, not for each other."""
        if not self.group.ordered:
            return super()._start_round(send, receive)
        if send is not None:
            self._in_order(send.dest)
        if receive is not None:
            self._in_order(receive.source)
        self._grouped = True
        try:  # the receive first: posted with the send, never behind it
            _, posted = super()._start_round(None, receive)
            sends, _ = super()._start_round(send, None)
        finally:
            self._grouped = False
        return sends, posted

    def _in_order(self, peer: int) -> None:
        """Ordered mode: wait until this rank's earlier operations with ``peer`` are complete."""
        if not self.group.ordered or self._grouped:
            return
        for kind, (key, number) in self._unfinished.pop(peer, []):
            wait = self.group.wait_posted if kind == "send" else self.group.wait_sent
            if not wait(key, number, self.group.timeout):
                self.group.abort()
                raise TimeoutError(
                    f"rank {self.rank}: its {kind} {number} with rank {peer} (tag {key[2]}) did "
                    f"not complete within {self.group.timeout:.0f} s, and under NCCL's ordering "
                    "the next operation with that rank waits for it: post a round's send and "
                    "receive together (Transport.start_round)"
                )

    def _begun(self, peer: int, kind: str, handle) -> None:
        if self.group.ordered:
            self._unfinished[peer].append((kind, handle))

    def _irecv(self, source, tag, dtype, device):
        self._posted(source, tag)
        return super()._irecv(source, tag, dtype, device)

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        self._posted(source, tag)
        return super()._irecv_sized(source, tag, dtype, device, numel, out)

    def _wait_recv(self, handle):
        return self._take(handle.source, handle.tag, handle.dtype, handle.device)

    def _recv(self, source, tag, dtype, device):
        self._posted(source, tag)
        return self._take(source, tag, dtype, device)

    def _posted(self, source, tag):
        """Rendezvous mode: a receive from ``source`` with ``tag`` is posted now."""
        self._check_peer(source)
        self._in_order(source)
        if self.group.rendezvous:
            key = (source, self.rank, tag)
            self._begun(source, "receive", (key, self.group.post(key)))

    def _take(self, source, tag, dtype, device):
        """The next message from ``source`` with ``tag``, once it is there."""
        box = self.group.mailbox(source, self.rank, tag)
        deadline = time.monotonic() + self.group.timeout
        while True:
            if self.group.aborted:
                raise GroupAborted(f"rank {self.rank}: another rank of the group failed")
            try:
                message = box.get(timeout=self._POLL_SECONDS)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.group.abort()
                    raise TimeoutError(
                        f"rank {self.rank}: no message from rank {source} (tag {tag}) "
                        f"within {self.group.timeout:.0f} s"
                    ) from None
        if message.dtype != dtype:
            raise TypeError(
                f"rank {self.rank}: expected {dtype} from rank {source}, got {message.dtype}"
            )
        return message.to(device)

    def _waitall(self, handles):
        for handle in handles:
            if handle is None:  # buffered: complete once sent
                continue
            (source, dest, tag), number = handle
            if not self.group.wait_posted((source, dest, tag), number, self.group.timeout):
                self.group.abort()
                raise TimeoutError(
                    f"rank {self.rank}: send {number} to rank {dest} (tag {tag}) not received "
                    f"within {self.group.timeout:.0f} s; under rendezvous semantics (NCCL, MPI's "
                    "large messages) this schedule waits for a send before posting the receive "
                    "its peer's send needs"
                )
            if self.group.aborted:
                raise GroupAborted(f"rank {self.rank}: another rank of the group failed")

    def _allreduce_sum(self, tensor):
        tag = -1  # reserved: never produced by schedules, which use tags >= 0
        for peer in range(self.size):
            if peer != self.rank:
                self.group.mailbox(self.rank, peer, tag).put(tensor.detach().clone())
        parts = [
            tensor if peer == self.rank else self._take(peer, tag, tensor.dtype, tensor.device)
            for peer in range(self.size)
        ]
        # Summing in rank order on every rank gives the same bits everywhere.
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return tensor.copy_(total)

    def _barrier(self):
        try:
            self.group._barrier.wait(timeout=self.group.timeout)
        except threading.BrokenBarrierError:
            raise GroupAborted(f"rank {self.rank}: barrier broken by a failed rank") from None

    def abort(self, message: str) -> None:
        """Abort the whole in-process group and raise ``message`` on this rank."""
        self.group.abort()
        raise GroupAborted(message)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: peer {peer} outside the group of {self.size}")
