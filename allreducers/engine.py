"""The one engine that runs any schedule over any transport, and the sparse message format.

A message is one int32 tensor: ``[counts] | indices | value bits``. ``counts`` (one per item)
is present only when the receiver cannot know the item sizes in advance; values are float32
carried bit-for-bit in the int32 buffer (never indices through floats).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Callable

import torch

from allreducers.transports import Transport

from .schedule import Step

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


def run_schedule(
    transport: Transport,
    steps: Sequence[Step],
    produce: Callable,
    consume: Callable,
    device: torch.device,
    timer: PhaseTimer | None = None,
    meanwhile: Callable | None = None,
) -> None:
    """Run ``steps`` over ``transport``, one message out and one in per step.

    Per step the send of ``produce(step)`` is posted before the receive, so symmetric exchanges
    cannot deadlock; the received message goes to ``consume(step, message)``. Every step counts
    as one round, also when this rank idles.

    Args:
        transport: this rank's transport.
        steps: the schedule.
        produce: ``produce(step)`` returns the int32 message to send.
        consume: ``consume(step, message)`` takes the received message.
        device: where received messages are put.
        timer: adds the communication's seconds to ``"comm"`` (``None``: not timed).
        meanwhile: ``meanwhile(step)`` runs between the send and the receive: work that needs
            neither message then fills the time the received one takes to arrive.
    """
    timer = timer if timer is not None else PhaseTimer()
    for number, step in enumerate(steps):
        handles = []
        if step.send_to is not None:
            message = produce(step)
            with timer("comm"):
                handles.append(transport.isend(message, step.send_to, number))
        if meanwhile is not None:
            meanwhile(step)
        if step.recv_from is not None:
            with timer("comm"):
                received = transport.recv(step.recv_from, number, torch.int32, device)
            consume(step, received)
        with timer("comm"):
            transport.waitall(handles)
        transport.traffic.rounds += 1


def pack(lists: Sequence[SparseList], with_counts: bool) -> torch.Tensor:
    """Pack sparse lists into one int32 message (see the module docstring)."""
    counts = [len(idx) for idx, _ in lists]
    total = sum(counts)
    head = len(counts) if with_counts else 0
    device = lists[0][0].device if lists else torch.device("cpu")
    message = torch.empty(head + 2 * total, dtype=torch.int32, device=device)
    if with_counts:
        message[:head] = torch.tensor(counts, dtype=torch.int32)
    indices = message[head : head + total]
    values = message[head + total :].view(torch.float32)
    start = 0
    for (idx, val), count in zip(lists, counts):
        indices[start : start + count] = idx
        values[start : start + count] = val
        start += count
    return message


def unpack(message: torch.Tensor, items: int, sizes: Sequence[int] | None = None) -> list:
    """Split a message into ``items`` sparse lists (see the module docstring).

    ``sizes`` gives their lengths when the message carries no counts.

    Raises:
        RuntimeError: the message's length does not fit the sizes.
    """
    if sizes is None:
        sizes = message[:items].tolist()
        body = message[items:]
    else:
        body = message
    total = sum(sizes)
    if body.numel() != 2 * total:
        raise RuntimeError(f"malformed message: {body.numel()} words for {total} entries")
    indices, values = body[:total], body[total:].view(torch.float32)
    lists, start = [], 0
    for size in sizes:
        lists.append((indices[start : start + size], values[start : start + size]))
        start += size
    return lists


def allgather_lists(
    transport: Transport,
    steps: Sequence[Step],
    own_item: int,
    own: SparseList,
    fixed_size: int | None,
    timer: PhaseTimer | None = None,
    meanwhile: Callable | None = None,
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

    Returns:
        ``{item: (indices, values)}`` for every item of the group.
    """
    held = {own_item: own}

    def produce(step: Step) -> torch.Tensor:
        return pack([held[item] for item in step.send_items], with_counts=fixed_size is None)

    def consume(step: Step, message: torch.Tensor) -> None:
        sizes = None if fixed_size is None else [fixed_size] * len(step.recv_items)
        for item, entry in zip(step.recv_items, unpack(message, len(step.recv_items), sizes)):
            held[item] = entry

    run_schedule(
        transport,
        steps,
        produce,
        consume,
        own[0].device,
        timer,
        None if meanwhile is None else lambda step: meanwhile(held),
    )
    return held
