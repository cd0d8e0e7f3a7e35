"""The codec seam: how sparse lists and dense values travel (docs/DESIGN.md, section "The wire").

``codec(wire)`` returns the :class:`Codec` of a wire format: ``"fp32"`` (int32 indices, float32
values, the original layout, bit for bit), ``"fp16"`` or ``"bf16"`` (16-bit values, indices as
16-bit offsets where they fit). Methods hand ``(indices, values)`` lists to the engine; only the
codec knows the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

#: The wire formats, by name.
WIRES = ("fp32", "fp16", "bf16")

_SEGMENT = 1 << 16  # the span one 16-bit offset covers
_FP16_MAX = float(torch.finfo(torch.float16).max)
_LOWEST_EXPONENT = -125  # below it a decoded fp16 value times 2^e could round in float32


def check_wire(wire) -> str:
    """Return ``wire`` if it names a wire format.

    Raises:
        ValueError: it does not; the message names the valid ones.
    """
    if not isinstance(wire, str) or wire not in WIRES:
        raise ValueError(f"wire={wire!r} is not a wire format; valid: {', '.join(WIRES)}")
    return wire


def codec(wire: str = "fp32") -> Codec:
    """Return the codec of wire format ``wire`` (one of :data:`WIRES`).

    Raises:
        ValueError: an unknown wire format.
    """
    return _CODECS[check_wire(wire)]


class Codec:
    """Encodes sparse lists and dense values into one message and decodes them.

    The fp32 codec's messages are int32 tensors: ``[counts] | indices | value bits``. Compact
    codecs' messages are uint8 tensors (layout in docs/DESIGN.md, section "The wire").

    Args:
        wire: the format's name, one of :data:`WIRES`.
    """

    def __init__(self, wire: str) -> None:
        self.wire = check_wire(wire)
        #: True where values travel in 16 bits (and may change on the way: see quantize).
        self.compact = wire != "fp32"
        #: The dtype a receiver asks the transport for.
        self.recv_dtype = torch.uint8 if self.compact else torch.int32
        self._half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(wire)

    # Values ---------------------------------------------------------------------------------

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire.

        fp16: the ``e`` that puts the largest magnitude in [2^15, 65504] (at least -125), so
        nothing overflows and small lists keep their precision; 0 for other formats.

        Raises:
            ValueError: ``values`` hold NaN or inf.
        """
        if self.wire != "fp16" or values.numel() == 0:
            return 0
        largest = float(values.abs().max())
        if not math.isfinite(largest):
            raise ValueError(f"wire={self.wire!r}: a message holds NaN or inf")
        if largest == 0.0:
            return 0
        exponent = math.frexp(largest)[1] - 16
        if math.ldexp(largest, -exponent) > _FP16_MAX:
            exponent += 1
        return max(exponent, _LOWEST_EXPONENT)

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` as a receiver decodes them when they travel as one list.

        The identity for fp32 (``values`` itself). Quantizing what this returns gives the same
        bits again, also for any sub-list of it, so a value forwarded keeps its bits.

        Raises:
            ValueError: ``values`` hold NaN or inf (fp16), or a bf16 value overflows.
        """
        if not self.compact:
            return values
        exponent = self.exponent(values)
        return self._from_half(self._to_half(values, exponent), exponent)

    def _to_half(self, values: torch.Tensor, exponent: int) -> torch.Tensor:
        if exponent:
            values = values * math.ldexp(1.0, -exponent)
        half = values.to(self._half)
        if self.wire == "bf16" and half.numel() and not bool(torch.isfinite(half).all()):
            raise ValueError("wire='bf16': a message holds NaN or inf")
        return half

    @staticmethod
    def _from_half(half: torch.Tensor, exponent: int) -> torch.Tensor:
        values = half.float()
        return values.mul_(math.ldexp(1.0, exponent)) if exponent else values

    # Sparse lists ---------------------------------------------------------------------------

    def encode(self, lists: Sequence[tuple], with_counts: bool) -> torch.Tensor:
        """Return one message holding the (indices, values) ``lists``.

        Indices may be int32 or int64 (each below 2^31); the fp32 codec carries the counts only
        ``with_counts``, compact codecs always.
        """
        if not self.compact:
            return _pack_fp32(lists, with_counts)
        device = lists[0][1].device if lists else torch.device("cpu")
        counts = [int(values.numel()) for _, values in lists]
        exponents = [self.exponent(values) for _, values in lists]
        total = sum(counts)
        if total:
            indices = torch.cat([idx.to(device=device, dtype=torch.int64) for idx, _ in lists])
            halves = torch.cat(
                [self._to_half(values, e) for (_, values), e in zip(lists, exponents)]
            )
        else:
            indices = torch.empty(0, dtype=torch.int64, device=device)
            halves = torch.empty(0, dtype=self._half, device=device)
        bases, lengths, offsets = _offsets(indices)
        if offsets is None:
            form, index_bytes = 0, indices.to(torch.int32).view(torch.uint8)
        else:
            form, index_bytes = 1, offsets.view(torch.uint8)
        runs = len(bases)
        header = [len(lists), form, runs, *counts, *exponents, *bases, *lengths]
        head = torch.tensor(header, dtype=torch.int32).view(torch.uint8).to(device)
        return torch.cat([head, index_bytes, halves.view(torch.uint8)])

    def decode(self, message: torch.Tensor, items: int, sizes: Sequence[int] | None = None):
        """Return the ``items`` (int32 indices, float32 values) lists of a message.

        ``sizes`` gives their lengths where an fp32 message carries no counts (compact messages
        always carry them; given ``sizes`` are then checked).

        Raises:
            RuntimeError: the message does not fit.
        """
        if not self.compact:
            return _unpack_fp32(message, items, sizes)
        words = message[:12].view(torch.int32).tolist() if message.numel() >= 12 else []
        if len(words) != 3 or words[0] != items:
            raise RuntimeError(f"malformed message: expected {items} lists")
        _, form, runs = words
        head_words = 3 + 2 * items + 2 * runs
        head = message[: 4 * head_words].view(torch.int32)
        fields = head.tolist()
        counts = fields[3 : 3 + items]
        exponents = fields[3 + items : 3 + 2 * items]
        total = sum(counts)
        if sizes is not None and list(sizes) != counts:
            raise RuntimeError(f"malformed message: sizes {counts}, expected {list(sizes)}")
        index_size = 4 if form == 0 else 2
        start = 4 * head_words
        if message.numel() != start + (index_size + 2) * total:
            raise RuntimeError(f"malformed message: {message.numel()} bytes for {total} entries")
        body = message[start : start + index_size * total]
        if form == 0:
            indices = body.view(torch.int32)
        else:
            bases = head[3 + 2 * items : 3 + 2 * items + runs]
            lengths = head[3 + 2 * items + runs :]
            offsets = body.view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF)
            indices = offsets.add_(torch.repeat_interleave(bases, lengths.long()).to(offsets))
        halves = message[start + index_size * total :].view(self._half)
        lists, first = [], 0
        for count, exponent in zip(counts, exponents):
            part = slice(first, first + count)
            lists.append((indices[part], self._from_half(halves[part], exponent)))
            first += count
        return lists

    def encode_rows(self, columns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Return one message holding the rows of ``(r, w)`` ``columns`` and ``values`` as r lists.

        The same bytes as :meth:`encode` of the r row lists without counts; at fp32 a constant
        number of operations, whatever r is (a compact codec encodes list by list).
        """
        if self.compact:
            return self.encode(list(zip(columns, values)), with_counts=False)
        size = columns.numel()
        message = torch.empty(2 * size, dtype=torch.int32, device=values.device)
        message[:size].view(columns.shape).copy_(columns)
        message[size:].view(torch.float32).view(values.shape).copy_(values)
        return message

    def decode_rows(self, message: torch.Tensor, rows: int, width: int) -> tuple:
        """Return the ``(rows, width)`` (int32 columns, float32 values) of an :meth:`encode_rows`.

        Raises:
            RuntimeError: the message does not hold ``rows`` lists of ``width`` entries.
        """
        if self.compact:
            lists = self.decode(message, rows, [width] * rows)
            return (
                torch.stack([indices for indices, _ in lists]),
                torch.stack([values for _, values in lists]),
            )
        size = rows * width
        if message.numel() != 2 * size:
            raise RuntimeError(f"malformed message: {message.numel()} words for {size} entries")
        values = message[size:].view(torch.float32)
        return message[:size].view(rows, width), values.view(rows, width)

    def decode_one(self, message: torch.Tensor) -> tuple:
        """Return the (indices, values) of a message encoded from one list without counts."""
        if not self.compact:
            count = message.numel() // 2
            return message[:count], message[count:].view(torch.float32)
        return self.decode(message, 1)[0]

    def quantize_parts(self, values: torch.Tensor, counts: Sequence[int], kept: int):
        """Return ``values`` with every part but part ``kept`` quantized as it travels alone.

        Parts are consecutive entries of sizes ``counts``; part ``kept`` stays home, as it is.
        ``values`` itself at fp32.
        """
        if not self.compact:
            return values
        bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        sent = values.clone()
        for part, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            if part != kept:
                sent[a:b] = self.quantize(values[a:b])
        return sent

    def encode_parts(
        self, indices: torch.Tensor, values: torch.Tensor, counts: Sequence[int], home: int
    ) -> list:
        """Return one one-list message per part of consecutive entries of sizes ``counts``.

        Part p is entries ``sum(counts[:p]) ..`` of ``(indices, values)``; its message is what
        :meth:`encode` makes of that list without counts. Part ``home`` does not travel: a
        compact codec encodes nothing for it (``None``). At fp32 the messages are views of one
        buffer made by one ``cat`` of the parts' slices after one conversion of the indices:
        two kernels on a GPU, whatever the number of parts.
        """
        bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        spans = list(zip(bounds[:-1], bounds[1:]))
        if self.compact:
            return [
                None if part == home else self.encode([(indices[a:b], values[a:b])], False)
                for part, (a, b) in enumerate(spans)
            ]
        words, bits = indices.to(torch.int32), values.view(torch.int32)
        buffer = torch.cat([piece for a, b in spans for piece in (words[a:b], bits[a:b])])
        return [buffer[2 * a : 2 * b] for a, b in spans]

    def decode_joined(self, items: Sequence) -> tuple:
        """Return the lists of ``items``, joined in order, and their lengths.

        An item is a one-list message (:meth:`decode_one`) or an ``(indices, values)`` list that
        did not travel. Returns ``(int32 indices, float32 values, sizes)``; at fp32 two ``cat``
        of the items' halves (views), sized by the messages' lengths (no read of the data).

        Raises:
            RuntimeError: an fp32 message of an odd number of words.
        """
        indices, words = [], []  # words: the values' bits, as int32
        for item in items:
            if not isinstance(item, tuple) and not self.compact:  # int32 words already
                half = item.numel() // 2
                if 2 * half != item.numel():
                    raise RuntimeError(f"malformed message: {item.numel()} words")
                indices.append(item[:half])
                words.append(item[half:])
                continue
            listed, item_values = item if isinstance(item, tuple) else self.decode_one(item)
            indices.append(listed.to(torch.int32))
            words.append(item_values.view(torch.int32))
        if not indices:
            return torch.empty(0, dtype=torch.int32), torch.empty(0), []
        sizes = [part.numel() for part in indices]
        return torch.cat(indices), torch.cat(words).view(torch.float32), sizes

    # Dense values ---------------------------------------------------------------------------

    def encode_values(self, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return one message holding the float32 tensors ``pieces`` (no indices).

        fp32: their bits as int32. Compact: each piece's exponent, then the 16-bit values.
        """
        if not self.compact:
            return torch.cat(list(pieces)).view(torch.int32)
        exponents = [self.exponent(piece) for piece in pieces]
        device = pieces[0].device if pieces else torch.device("cpu")
        head = torch.tensor(exponents, dtype=torch.int32).view(torch.uint8).to(device)
        halves = [self._to_half(piece, e).view(torch.uint8) for piece, e in zip(pieces, exponents)]
        return torch.cat([head, *halves])

    def decode_values(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return the float32 pieces of lengths ``sizes`` of an :meth:`encode_values` message.

        Raises:
            RuntimeError: the message does not fit.
        """
        head, width = (4 * len(sizes), 2) if self.compact else (0, 1)
        if message.numel() != head + width * sum(sizes):
            raise RuntimeError(f"malformed message: {message.numel()} elements for {sizes}")
        if not self.compact:
            return list(torch.split(message.view(torch.float32), list(sizes)))
        exponents = message[:head].view(torch.int32).tolist()
        halves = message[head:].view(self._half)
        pieces, first = [], 0
        for size, exponent in zip(sizes, exponents):
            pieces.append(self._from_half(halves[first : first + size], exponent))
            first += size
        return pieces


def _offsets(indices: torch.Tensor) -> tuple:
    """Return ``(bases, lengths, uint16 offsets as int16)`` for ``indices``, or no offsets.

    Runs of consecutive entries whose ``(index - min) >> 16`` agree share one base; offsets are
    returned only where they take fewer bytes than int32 indices.
    """
    total = indices.numel()
    if total == 0:
        return [], [], None
    lowest = int(indices.min())
    relative = indices - lowest
    high = relative >> 16
    starts = torch.cat(
        [
            torch.zeros(1, dtype=torch.int64, device=indices.device),
            torch.nonzero(high[1:] != high[:-1]).squeeze(1) + 1,
        ]
    )
    runs = starts.numel()
    if 8 * runs + 2 * total >= 4 * total:
        return [], [], None
    bases = (high.index_select(0, starts) * _SEGMENT + lowest).tolist()
    edges = starts.tolist() + [total]
    lengths = [edges[i + 1] - edges[i] for i in range(runs)]
    return bases, lengths, (relative & 0xFFFF).to(torch.int16)


def _pack_fp32(lists: Sequence[tuple], with_counts: bool) -> torch.Tensor:
    """Pack sparse lists into one int32 message ``[counts] | indices | value bits``."""
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


def _unpack_fp32(message: torch.Tensor, items: int, sizes: Sequence[int] | None = None) -> list:
    """Split an int32 message into ``items`` sparse lists; ``sizes`` where it has no counts."""
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


_CODECS = {wire: Codec(wire) for wire in WIRES}
