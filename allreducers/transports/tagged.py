"""A view of a transport with a tag range and traffic counters of its own.

Collectives that may be in flight at the same time on one group (the buckets of one backward
pass) must not take each other's messages. Each gets a :class:`TaggedTransport` over the common
transport: its schedule's tags ``0 .. stride - 1`` travel as ``offset + tag``, and its traffic is
counted in the view, so a bucket's bytes are its own and a step's are the sum over its buckets.

    >>> from allreducers.transports import local_group
    >>> def exchange(transport):
    ...     bucket = TaggedTransport(transport, space=1)
    ...     bucket.waitall([bucket.isend(torch.ones(2), 1 - transport.rank, 0)])
    ...     return bucket.recv(1 - transport.rank, 0, torch.float32, torch.device("cpu")).tolist()
    >>> local_group(2).run(exchange)
    [[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import torch

from .base import Transport

__all__ = ["TAG_STRIDE", "tag_upper_bound", "TaggedTransport"]

#: Tags per space: a schedule's steps are numbered from 0 (at most about 2 P + log2 P of them).
TAG_STRIDE = 4096


def tag_upper_bound(transport: Transport) -> int | None:
    """Return the largest tag ``transport``'s library accepts (``None``: no known bound).

    Its ``capabilities.tag_bound``: MPI's is the communicator's ``MPI_TAG_UB`` (at least
    32767); Gloo's and NCCL's are int32.
    """
    return transport.capabilities.tag_bound


class TaggedTransport(Transport):
    """``base`` with point-to-point tags moved to space ``space`` and traffic counted apart.

    Only point-to-point messages are told apart: collectives (``allreduce_sum``) of two views
    of one group must still be called in the same order on every rank, from one thread at a
    time (as :class:`compressors.pipeline.BucketPipeline` does).

    Args:
        base: the underlying transport (never another view: a view of a view adds offsets).
        space: which range of :data:`TAG_STRIDE` tags this view uses, from 0.
        stride: tags per space.

    Raises:
        ValueError: ``space`` is negative, or its tags pass the library's bound.
    """

    def __init__(self, base: Transport, space: int, stride: int = TAG_STRIDE) -> None:
        super().__init__()
        if isinstance(base, TaggedTransport):
            base = base.base
        if space < 0:
            raise ValueError(f"tag space must be >= 0, got {space}")
        bound = tag_upper_bound(base)
        if bound is not None and (space + 1) * stride - 1 > bound:
            raise ValueError(
                f"tag space {space} needs tags up to {(space + 1) * stride - 1}, above this "
                f"library's bound {bound}; use fewer buckets (a larger bucket size)"
            )
        self.base = base
        self.space = space
        self.stride = stride
        self.offset = space * stride
        self.rank = base.rank
        self.size = base.size

    @property
    def capabilities(self):
        """The underlying transport's."""
        return self.base.capabilities

    def process_key(self) -> tuple:
        """The underlying transport's."""
        return self.base.process_key()

    def check_threads(self, what: str) -> None:
        """The underlying transport's."""
        self.base.check_threads(what)

    def agreement_device(self):
        """The underlying transport's."""
        return self.base.agreement_device()

    def _tag(self, tag: int) -> int:
        if not 0 <= tag < self.stride:
            raise ValueError(f"tag {tag} outside this view's range 0..{self.stride - 1}")
        return self.offset + tag

    def isend(self, tensor: torch.Tensor, dest: int, tag: int, sized: bool = False):
        """Start sending ``tensor`` to ``dest`` with this view's ``tag``; return a handle.

        Raises:
            ValueError: ``tag`` is outside ``0 .. stride - 1`` (nothing is counted or sent).
        """
        self._tag(tag)
        return super().isend(tensor, dest, tag, sized)

    def start_round(self, send=None, receive=None):
        """Start a round with this view's tags (as :meth:`isend` checks them)."""
        for part in (send, receive):
            if part is not None:
                self._tag(part.tag)
        return super().start_round(send, receive)

    def _start_round(self, send, receive):
        send = send._replace(tag=self._tag(send.tag)) if send is not None else None
        receive = receive._replace(tag=self._tag(receive.tag)) if receive is not None else None
        return self._counted(self.base._start_round, send, receive)

    def _counted(self, method, *args):
        """Call ``base``'s ``method``; count in this view the host synchronizations it made."""
        before = self.base.traffic.host_syncs
        try:
            return method(*args)
        finally:
            self.traffic.host_syncs += self.base.traffic.host_syncs - before

    def _isend_sized(self, tensor, dest, tag):
        return self.base._isend_sized(tensor, dest, self._tag(tag))

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        return self._counted(
            self.base._recv_sized, source, self._tag(tag), dtype, device, numel, out
        )

    def _isend(self, tensor, dest, tag):
        return self.base._isend(tensor, dest, self._tag(tag))

    def _recv(self, source, tag, dtype, device):
        return self._counted(self.base._recv, source, self._tag(tag), dtype, device)

    def _irecv(self, source, tag, dtype, device):
        return self.base._irecv(source, self._tag(tag), dtype, device)

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        return self._counted(
            self.base._irecv_sized, source, self._tag(tag), dtype, device, numel, out
        )

    def _wait_recv(self, handle):
        return self._counted(self.base._wait_recv, handle)

    def _waitall(self, handles):
        return self._counted(self.base._waitall, handles)

    def _allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._counted(self.base._allreduce_sum, tensor)

    def _allreduce_sum_into(self, tensor, out):
        return self._counted(self.base._allreduce_sum_into, tensor, out)

    def _barrier(self):
        return self._counted(self.base._barrier)

    def abort(self, message: str) -> None:
        """End the whole group as ``base`` does."""
        self.base.abort(message)
