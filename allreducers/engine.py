"""The one engine that runs any schedule over any transport; messages are the codec's.

The bytes of a message belong to :mod:`allreducers.wire`: at ``wire="fp32"`` one int32 tensor
``[counts] | indices | value bits`` (``counts`` only where the receiver cannot know the sizes),
at ``"fp16"``/``"bf16"`` a uint8 tensor (docs/DESIGN.md, section "The wire").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Callable

import torch

from allreducers.transports import Incoming, Outgoing, Transport

from .device import device_tensor
from .schedule import Step
from .wire import codec

__all__ = [
    "SparseList",
    "PhaseTimer",
    "MessageBuffers",
    "index_add_in_order",
    "run_schedule",
    "allgather_lists",
    "allgather_regions",
    "allgather_rows",
    "allgather_rows_in_order",
    "allgather_joined",
]

SparseList = tuple  # (indices: int32 1-D tensor, values: float32 1-D tensor)


class PhaseTimer(dict):
    """Seconds spent per phase name; ``with timer("select"): ...`` adds to ``timer["select"]``."""

    def __call__(self, phase: str) -> _Phase:
        """Return a context manager that adds the seconds its block takes to ``phase``."""
        return _Phase(self, phase)


class _Phase:
    def __init__(self, timer: PhaseTimer, phase: str) -> None:
        self.timer, self.phase = timer, phase

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timer[self.phase] = self.timer.get(self.phase, 0.0) + time.perf_counter() - self.start


class MessageBuffers:
    """Message buffers kept across calls: one per direction, size, dtype and device.

    A schedule whose messages have sizes every rank knows (``recv_numel``) sends and receives
    the same sizes call after call, so a synchronizer allocates each buffer once and reuses it.
    :func:`run_schedule` reuses a send buffer only after its step's ``waitall``, and a receive
    buffer only after its step's ``consume``: a ``consume`` must not keep views of its message
    (it copies what it keeps). On a GPU a buffer is kept per stream too: the kernels of one
    stream run in order, so the next call's writes wait for the last call's reads.
    """

    def __init__(self) -> None:
        self._held: dict = {}

    def get(self, role: str, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        """Return the ``role`` buffer (``"send"`` or ``"recv"``) of ``numel`` ``dtype`` elements."""
        device = torch.device(device)
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        key = (role, numel, dtype, device, stream)
        buffer = self._held.get(key)
        if buffer is None:
            buffer = self._held[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer


def index_add_in_order(
    target: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, sizes: Sequence[int]
) -> None:
    """Add joined lists into ``target`` one list after the other; ``sizes``: their lengths.

    Each list must hold distinct indices; lists may share them. On the CPU one ``index_add_``
    over all of them (it adds index by index, in order: the bits of one call per list); on a
    GPU, whose ``index_add_`` adds duplicates in any order, one list at a time. int32 indices
    are used as they are (``index_add_`` takes them): no int64 copy.
    """
    if indices.dtype != torch.int32:
        indices = indices.long()
    if target.device.type == "cpu":
        target.index_add_(0, indices, values)
        return
    for part, part_values in zip(
        torch.split(indices, list(sizes)), torch.split(values, list(sizes))
    ):
        target.index_add_(0, part, part_values)


def run_schedule(
    transport: Transport,
    steps: Sequence[Step],
    produce: Callable,
    consume: Callable,
    device: torch.device,
    timer: PhaseTimer | None = None,
    meanwhile: Callable | None = None,
    dtype: torch.dtype = torch.int32,
    recv_numel: Callable | None = None,
    buffers: MessageBuffers | None = None,
) -> None:
    """Run ``steps`` over ``transport``, one message out and one in per step.

    Per step the send of ``produce(step)`` and the receive are posted together, as one round
    (:meth:`Transport.start_round`), so symmetric exchanges cannot deadlock, under NCCL's
    ordering either; the received message goes to ``consume(step, message)``. Every step counts
    as one round, also when this rank idles.

    Args:
        transport: this rank's transport.
        steps: the schedule.
        produce: ``produce(step)`` returns the message to send.
        consume: ``consume(step, message)`` takes the received message.
        device: where received messages are put.
        timer: adds the communication's seconds to ``"comm"`` (``None``: not timed).
        meanwhile: ``meanwhile(step)`` runs between the send and the receive: work that needs
            neither message then fills the time the received one takes to arrive (a receive of
            known length is posted before it).
        dtype: the dtype messages are received as (the codec's ``recv_dtype``).
        recv_numel: ``recv_numel(step)``, the length of the message ``step`` receives, where
            every rank knows it (fixed-size messages): the sends go ``sized`` and a transport
            that frames messages sends no length (no read of it from a GPU). ``None``: any
            length.
        buffers: with ``recv_numel``, where a transport that can write a message into a given
            buffer receives it (the same buffer each call); ``produce`` may take its message's
            buffer from them too (``"send"``).
    """
    timer = timer if timer is not None else PhaseTimer()
    sized = recv_numel is not None
    for number, step in enumerate(steps):
        send = receive = None
        if step.send_to is not None:
            send = Outgoing(produce(step), step.send_to, number, sized)
        if step.recv_from is not None:
            numel = recv_numel(step) if sized else None
            out = (
                None if buffers is None or not sized else buffers.get("recv", numel, dtype, device)
            )
            receive = Incoming(step.recv_from, number, dtype, device, numel, out)
        with timer("comm"):
            # One group: the receive is posted with the send (a library that moves a message
            # only once its receive is posted, Gloo or MPI's large messages, then moves it
            # during ``meanwhile``), and neither waits behind the other (NCCL).
            handles, posted = transport.start_round(send, receive)
        if meanwhile is not None:
            meanwhile(step)
        if posted is not None:
            with timer("comm"):
                received = transport.wait_recv(posted)
            consume(step, received)
        with timer("comm"):
            transport.waitall(handles)
        transport.traffic.rounds += 1


def allgather_lists(
    transport: Transport,
    steps: Sequence[Step],
    own_item: int,
    own: SparseList,
    fixed_size: int | None,
    timer: PhaseTimer | None = None,
    meanwhile: Callable | None = None,
    wire: str = "fp32",
    span: int | None = None,
) -> dict:
    """All-gather sparse lists along an all-gather schedule (Bruck).

    Args:
        transport: this rank's transport.
        steps: the all-gather schedule.
        own_item: the item this rank contributes.
        own: its list.
        fixed_size: every list's length when all ranks know it (no counts on the wire), else
            ``None``.
        timer: as in :func:`run_schedule`.
        meanwhile: ``meanwhile(held)`` runs in every step while its message travels (see
            :func:`run_schedule`), with the ``{item: list}`` held so far, to use those early.
        wire: the wire format. The lists travel as they are; at a compact wire a list a rank
            forwards keeps its bits only if it was quantized (``codec(wire).quantize``) first.
        span: every list ascends in ``[0, span)`` (a compact wire then sends 16-bit offsets
            without a read: ``Codec.encode``); ``None``: lists of any order.

    Returns:
        ``{item: (indices, values)}`` for every item of the group.
    """
    held = {own_item: own}
    coder = codec(wire)

    def produce(step: Step) -> torch.Tensor:
        lists = [held[item] for item in step.send_items]
        return coder.encode(lists, fixed_size is None, span)

    def consume(step: Step, message: torch.Tensor) -> None:
        sizes = None if fixed_size is None else [fixed_size] * len(step.recv_items)
        lists = coder.decode(message, len(step.recv_items), sizes, span)
        for item, entry in zip(step.recv_items, lists):
            held[item] = entry

    run_schedule(
        transport,
        steps,
        produce,
        consume,
        own[0].device,
        timer,
        None if meanwhile is None else lambda step: meanwhile(held),
        coder.recv_dtype,
    )
    return held


def allgather_regions(
    transport: Transport,
    steps: Sequence[Step],
    coder,
    own_item: int,
    own_message: torch.Tensor,
    sizes: Sequence[int],
    timer: PhaseTimer | None = None,
) -> dict:
    """All-gather dense regions along a Bruck schedule, each forwarded as it arrived.

    ``own_message``: this rank's region as ``coder.encode_region`` coded it; ``sizes``: every
    item's region length. A step that sends the own region alone sends ``own_message`` itself
    (no copy); others join the regions they send (``Codec.join_regions``). Returns ``{item:
    (head, body)}`` for every item, views of the messages, for ``Codec.decode_region``.
    """
    coded = {own_item: coder.split_regions(own_message, [sizes[own_item]])[0]}

    def produce(step: Step) -> torch.Tensor:
        if tuple(step.send_items) == (own_item,):
            return own_message
        return coder.join_regions([coded[item] for item in step.send_items])

    def consume(step: Step, message: torch.Tensor) -> None:
        regions = coder.split_regions(message, [sizes[item] for item in step.recv_items])
        coded.update(zip(step.recv_items, regions))

    device = own_message.device
    run_schedule(transport, steps, produce, consume, device, timer, dtype=coder.recv_dtype)
    return coded


def allgather_rows(
    transport: Transport,
    steps: Sequence[Step],
    tables: tuple,
    span: int,
    timer: PhaseTimer | None = None,
    wire: str = "fp32",
    meanwhile: Callable | None = None,
    first: int | None = None,
    buffers: MessageBuffers | None = None,
) -> None:
    """All-gather rows of fixed width along a Bruck schedule, into ``tables``.

    ``tables``: ``(columns, values)``, tensors of shape ``(items, width)`` whose row r is item
    ``(first + r) % items``; ``first`` defaults to this rank's item ``own`` (the order the
    schedule holds them), and the row of ``own`` is filled. Each row's columns ascend in ``[0,
    span)`` (a short list repeats its last entry). Bruck's step of distance 2^s sends items
    ``own .. own + c - 1`` and receives items ``own + 2^s ..`` (rows ``[0, c)`` and ``[2^s, 2^s
    + c)`` in the schedule's order; in another order a range can wrap past the last row): one
    range of rows a message (``Codec.encode_rows``), whose size every rank knows, so no count
    travels and nothing is read from the device. At a 16-bit wire the rows keep their bits if
    they were quantized by rows (``Codec.quantize_rows``) first. ``meanwhile(step, held)`` runs
    in every step while its message travels, the schedule's first ``held`` items being here
    (with the default ``first``: rows 0 .. held-1). ``buffers``: the messages' buffers, kept
    across calls (:class:`MessageBuffers`).
    """
    coder, (columns, values) = codec(wire), tables
    count, width = values.shape
    own = steps[0].send_items[0] if steps else 0  # Bruck: this rank's item goes first
    first = own if first is None else first
    held = [1]

    def rows(items) -> list:
        """The slices of ``tables`` that hold the consecutive ``items`` (two where they wrap)."""
        start = (items[0] - first) % count
        end = start + len(items)
        if end <= count:
            return [slice(start, end)]
        return [slice(start, count), slice(0, end - count)]

    def produce(step: Step) -> torch.Tensor:
        send = rows(step.send_items)
        out = None
        if buffers is not None:
            size = coder.rows_size(len(step.send_items), width, span)
            out = buffers.get("send", size, coder.recv_dtype, values.device)
        if len(send) == 1:
            return coder.encode_rows(columns[send[0]], values[send[0]], span, out=out)
        joined = [torch.cat([table[part] for part in send]) for table in (columns, values)]
        return coder.encode_rows(*joined, span, out=out)

    def consume(step: Step, message: torch.Tensor) -> None:
        got = coder.decode_rows(message, len(step.recv_items), width, span)
        parts = rows(step.recv_items)
        if len(parts) == 1:
            columns[parts[0]], values[parts[0]] = got
        else:  # the range wraps: its head fills the last rows, its tail the first
            cut = parts[0].stop - parts[0].start
            for table, arrived in zip((columns, values), got):
                table[parts[0]], table[parts[1]] = arrived[:cut], arrived[cut:]
        held[0] += len(step.recv_items)

    run_schedule(
        transport,
        steps,
        produce,
        consume,
        values.device,
        timer,
        meanwhile=None if meanwhile is None else lambda step: meanwhile(step, held[0]),
        dtype=coder.recv_dtype,
        recv_numel=lambda step: coder.rows_size(len(step.recv_items), width, span),
        buffers=buffers,
    )


def allgather_rows_in_order(
    transport: Transport,
    steps: Sequence[Step],
    own: SparseList,
    span: int,
    timer: PhaseTimer | None = None,
    wire: str = "fp32",
    buffers: MessageBuffers | None = None,
) -> tuple:
    """All-gather one list of a fixed length per item as rows (:func:`allgather_rows`).

    ``own``: this rank's ``(columns, values)``, 1-D. Returns ``(columns, values)`` of shape
    ``(items, length)`` whose row i is item i's list (the columns of ``own``'s dtype), each
    received row written in its place (no copy to reorder them). ``buffers``: as in
    :func:`allgather_rows`.
    """
    items = 1 + sum(len(step.recv_items) for step in steps)  # Bruck: each arrives once
    position = steps[0].send_items[0] if steps else 0
    length, device = own[1].numel(), own[1].device
    columns = torch.empty((items, length), dtype=own[0].dtype, device=device)
    values = torch.empty((items, length), device=device)
    columns[position], values[position] = own
    allgather_rows(transport, steps, (columns, values), span, timer, wire, first=0, buffers=buffers)
    return columns, values


def allgather_joined(
    transport: Transport,
    steps: Sequence[Step],
    own: SparseList,
    fixed_size: int | None,
    timer: PhaseTimer | None = None,
    wire: str = "fp32",
    span: int | None = None,
    buffers: MessageBuffers | None = None,
) -> tuple:
    """All-gather sparse lists along a Bruck schedule, joined in item order.

    As :func:`allgather_lists` with ``own_item`` this rank's position, but the lists are kept
    joined: ``(indices, values, sizes)``, the items' lists one after another in item order
    0, 1, ... and their lengths (the indices int32). At fp32 each step costs a fixed number of
    operations (its message is a prefix of the lists held so far, in the order the schedule
    holds them: this rank's item first), and a call one host read per step where sizes vary
    (the counts). At a 16-bit wire lists of ``fixed_size`` entries whose indices ascend in
    ``[0, span)`` travel as rows (:func:`allgather_rows`): no read; the values keep their bits
    if quantized by rows; ``buffers``: their messages' buffers, as in :func:`allgather_rows`.
    """
    coder = codec(wire)
    position = steps[0].send_items[0] if steps else 0  # Bruck: this rank's item goes first
    if coder.compact and fixed_size is not None and span is not None:
        own = (own[0].to(torch.int32), own[1])
        columns, values = allgather_rows_in_order(transport, steps, own, span, timer, wire, buffers)
        return columns.view(-1), values.view(-1), [fixed_size] * columns.shape[0]
    if coder.compact:
        held = allgather_lists(
            transport, steps, position, own, fixed_size, timer, wire=wire, span=span
        )
        lists = [held[item] for item in sorted(held)]
        return (
            torch.cat([i.to(torch.int32) for i, _ in lists]),
            torch.cat([v for _, v in lists]),
            [v.numel() for _, v in lists],
        )
    blocks = _HeldBlocks(own, fixed_size)
    sized = None if fixed_size is None else lambda step: 2 * fixed_size * len(step.recv_items)
    run_schedule(
        transport,
        steps,
        blocks.message,
        blocks.take,
        own[1].device,
        timer,
        dtype=coder.recv_dtype,
        recv_numel=sized,
    )
    return blocks.in_item_order(position)


class _HeldBlocks:
    """The fp32 lists :func:`allgather_joined` holds, in the order held, as int32 blocks.

    This rank's item first, then item + 1, ...: one block of indices and one of value bits per
    step, views of the messages, no copy until :meth:`in_item_order`.
    """

    def __init__(self, own: SparseList, fixed_size: int | None) -> None:
        self.device, self.fixed_size = own[1].device, fixed_size
        self.index_blocks, self.value_blocks = [own[0].to(torch.int32)], [own[1].view(torch.int32)]
        self.sizes = [own[1].numel()]

    @staticmethod
    def _prefix(blocks: list, total: int) -> list:
        """The first ``total`` words of ``blocks``, as views."""
        taken = []
        for block in blocks:
            if total <= 0:
                break
            taken.append(block[:total])
            total -= block.numel()
        return taken

    def message(self, step: Step) -> torch.Tensor:
        """The message of ``step``: the first lists held, ``[counts] | indices | value bits``."""
        count = len(step.send_items)
        total = sum(self.sizes[:count])
        body = self._prefix(self.index_blocks, total) + self._prefix(self.value_blocks, total)
        if self.fixed_size is None:
            body.insert(0, device_tensor(self.sizes[:count], torch.int32, self.device))
        return torch.cat(body)

    def take(self, step: Step, message: torch.Tensor) -> None:
        """Hold the lists of the ``message`` received in ``step``, after those held.

        Raises:
            RuntimeError: the message does not fit its counts.
        """
        count = len(step.recv_items)
        if self.fixed_size is None:
            counts, body = message[:count].tolist(), message[count:]
        else:
            counts, body = [self.fixed_size] * count, message
        total = sum(counts)
        if body.numel() != 2 * total:
            raise RuntimeError(f"malformed message: {body.numel()} words for {total} entries")
        self.index_blocks.append(body[:total])
        self.value_blocks.append(body[total:])
        self.sizes.extend(counts)

    def in_item_order(self, position: int) -> tuple:
        """Return ``(int32 indices, float32 values, sizes)`` in item order, in one copy each.

        Held order is item order rotated by this rank's ``position``: rotated back.
        """
        sizes = self.sizes
        split = len(sizes) - position
        cut, total = sum(sizes[:split]), sum(sizes)
        indices = self._rotated(self.index_blocks, cut, total)
        values = self._rotated(self.value_blocks, cut, total)
        return indices, values.view(torch.float32), sizes[split:] + sizes[:split]

    @staticmethod
    def _rotated(blocks: list, cut: int, total: int) -> torch.Tensor:
        """The ``total`` words of ``blocks`` from word ``cut`` on, then those before it."""
        tail, head, start = [], [], 0
        for block in blocks:
            end = start + block.numel()
            if start < cut:
                head.append(block[: cut - start])
            if end > cut:
                tail.append(block[max(0, cut - start) :])
            start = end
        return torch.cat(tail + head) if total else blocks[0]
