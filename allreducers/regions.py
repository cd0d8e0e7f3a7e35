"""Ok-Topk's second engine: windowed split-and-reduce over contiguous regions.

:func:`run_windowed` runs a schedule as :func:`allreducers.run_schedule` does with several
steps in flight; :class:`RegionReducer` sends every region's entries to its owner along
:func:`allreducers.rotation_schedule` and adds them there (used by ``oktopk`` and ``topkdsa``).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from .device import device_tensor
from .engine import index_add_in_order
from .rotation import rotation_schedule
from .transports import Incoming, Outgoing
from .wire import codec

__all__ = ["run_windowed", "RegionReducer"]


def run_windowed(transport, steps, produce, consume, device, timer, window: int, dtype=None):
    """Run ``steps`` as :func:`allreducers.run_schedule` does, with up to ``window`` in flight.

    As there, ``consume`` runs in step order, each step is one round, and a step's tag is its
    number. The first ``window`` steps' sends and receives are started at once. Then, per step
    in order: wait for its message and for its send, start the step ``window`` further on, and
    only then ``consume`` the message, so that the reduction overlaps the next messages'
    travel (``produce`` must therefore not depend on what ``consume`` did). ``window=1`` is
    one blocking exchange per step. ``dtype``: what messages are received as (int32 if
    ``None``).
    """
    dtype = torch.int32 if dtype is None else dtype
    posted = deque()

    def post(number):
        step = steps[number]
        message = produce(step) if step.send_to is not None else None
        outgoing = Outgoing(message, step.send_to, number) if message is not None else None
        incoming = None
        if step.recv_from is not None:
            incoming = Incoming(step.recv_from, number, dtype, device)
        with timer("comm"):
            send, receive = transport.start_round(outgoing, incoming)
        posted.append((step, send, receive))

    for number in range(min(window, len(steps))):
        post(number)
    for number in range(len(steps)):
        step, send, receive = posted.popleft()
        with timer("comm"):
            message = transport.wait_recv(receive) if receive is not None else None
            transport.waitall(send)
        transport.traffic.rounds += 1
        if number + window < len(steps):
            post(number + window)
        if message is not None:
            consume(step, message)


class RegionReducer:
    """Split-and-reduce over contiguous regions (shared by ``oktopk`` and ``topkdsa``).

    Args:
        transport: this rank's transport.
        in_flight: how many of the P-1 exchanges may travel at once (:func:`run_windowed`).
        wire: the wire format (:mod:`allreducers.wire`).
    """

    def __init__(self, transport, in_flight: int = 1, wire: str = "fp32") -> None:
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.in_flight = in_flight
        self.codec = codec(wire)
        self.steps = rotation_schedule(self.rank, list(range(self.size)))
        self._sums = torch.empty(0)
        self._present = torch.empty(0, dtype=torch.bool)
        #: What the wire took off each entry of the last :meth:`reduce`'s ``values`` (value
        #: minus what its owner received; zeros for the own region's), ``None`` at fp32.
        self.lost = None

    def reduce(self, indices: torch.Tensor, values: torch.Tensor, boundaries: list, timer) -> tuple:
        """Send each other region's entries to its owner; return this rank's region's candidates.

        The owner adds its own entries first, then the received ones in step order.

        Args:
            indices: this rank's global indices, ascending.
            values: their values.
            boundaries: the regions' boundaries ``[0, c_1, ..., n]``; region r is this rank's.
            timer: times the phases.

        Returns:
            The ascending global indices (int32) that any rank sent into this rank's region,
            and their sums.
        """
        start, end = boundaries[self.rank], boundaries[self.rank + 1]
        device = values.device
        coder = self.codec
        with timer("accumulate"):
            edges = device_tensor(boundaries, indices.dtype, indices.device)
            positions = torch.searchsorted(indices, edges).tolist()
            sums, present = self._buffers(end - start, device)
        counts = [b - a for a, b in zip(positions[:-1], positions[1:])]
        # Each region's list as its owner decodes it; the own one stays as it is.
        sent, messages = coder.quantize_encode_parts(
            indices, values, counts, self.rank, boundaries[-1]
        )
        self.lost = values - sent if coder.compact else None
        own = slice(positions[self.rank], positions[self.rank + 1])
        received = {self.rank: (indices[own], values[own])}

        def consume(step, message):
            received[step.recv_from] = message

        run_windowed(
            self.transport,
            self.steps,
            lambda step: messages[step.send_items[0]],
            consume,
            device,
            timer,
            self.in_flight,
            coder.recv_dtype,
        )
        with timer("accumulate"):
            # The own entries first, then the received ones in step order.
            order = [self.rank] + [step.recv_from for step in self.steps]
            joined, summands, sizes = coder.decode_joined(
                [received[s] for s in order], boundaries[-1]
            )
            local = joined.long() - start
            index_add_in_order(sums, local, summands, sizes)
            present.index_fill_(0, local, True)
            if device.type == "cpu":
                local = torch.from_numpy(np.flatnonzero(present.numpy()))
            else:
                local = torch.nonzero(present).squeeze(1)
            return (local + start).to(torch.int32), sums.index_select(0, local)

    def region_sums(self, boundaries: list) -> torch.Tensor:
        """Return the dense sums of this rank's region after :meth:`reduce` (zeros elsewhere)."""
        return self._sums[: boundaries[self.rank + 1] - boundaries[self.rank]]

    def _buffers(self, size: int, device) -> tuple:
        if self._sums.numel() < size or self._sums.device != device:
            self._sums = torch.zeros(size, device=device)
            self._present = torch.zeros(size, dtype=torch.bool, device=device)
        sums, present = self._sums[:size], self._present[:size]
        sums.zero_()
        present.zero_()
        return sums, present
