"""The codec's contract (:class:`Codec`) and the fp32 layout (:class:`Fp32Codec`).

A codec is a message layout with a value format (:mod:`.formats`): ``Codec(wire)`` returns a
new codec of ``wire``'s class, each class registering the wire it names. fp32 messages are
int32 words ``[counts] | indices | value bits``, bit for bit the original layout; the 16-bit
wires share one byte layout (:mod:`.compact`).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch

from ..device import device_tensor
from .formats import FORMATS, ValueFormat, check_wire
from .layout import covered, message_buffer

__all__ = ["KINDS", "Codec", "Fp32Codec"]

#: The codec class of each wire, filled as the classes are defined.
KINDS: dict = {}


class Codec(abc.ABC):
    """Encodes sparse lists and dense values into one message and decodes them.

    ``Codec(wire)`` returns a new codec of the class of ``wire`` (:class:`Fp32Codec`,
    :class:`Fp16Codec` or :class:`Bf16Codec`); :func:`codec` returns a shared one. This class
    holds what they share and the methods' contracts; no method asks which wire it serves.

    Args:
        wire: the format's name, one of :data:`WIRES`.

    Raises:
        ValueError: an unknown wire format.
    """

    #: The format's name, one of :data:`WIRES`.
    wire: str = ""
    #: True where values travel in 16 bits (and may change on the way: see quantize).
    compact = False
    #: The dtype a receiver asks the transport for.
    recv_dtype = torch.int32
    #: The value format (:mod:`.formats`): every value the codec carries goes through it.
    format: ValueFormat = FORMATS["fp32"]

    def __init_subclass__(cls, **kwargs) -> None:
        """Register a class that names its wire as the codec of that wire."""
        super().__init_subclass__(**kwargs)
        if cls.wire:
            KINDS[cls.wire] = cls

    def __new__(cls, wire: str | None = None):
        """Return a new codec of the class of ``wire`` (default: the class's own, or fp32)."""
        kind = KINDS[check_wire(wire if wire is not None else cls.wire or "fp32")]
        if not issubclass(kind, cls):
            raise ValueError(f"{cls.__name__} is not the codec of wire={wire!r}")
        return super().__new__(kind)

    def __getnewargs__(self) -> tuple:
        return (self.wire,)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.wire!r})"

    # Values: the format's ---------------------------------------------------------------------

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire.

        0 but at fp16 (:meth:`.formats.Fp16Format.exponent`).
        """
        return self.format.exponent(values)

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` as a receiver decodes them when they travel as one list.

        The identity for fp32 (``values`` itself). Quantizing what this returns gives the same
        bits again, also for any sub-list of it, so a value forwarded keeps its bits.

        Raises:
            ValueError: ``values`` hold NaN or inf (fp16), or a bf16 value overflows.
        """
        return self.format.quantize(values)

    @abc.abstractmethod
    def quantize_parts(self, values: torch.Tensor, counts: Sequence[int], kept: int):
        """Return ``values`` with every part but part ``kept`` quantized as it travels alone.

        Parts are consecutive entries of sizes ``counts``; part ``kept`` stays home, as it is
        (-1: none). ``values`` itself at fp32; at a compact wire a copy, made without a read.
        """

    # Sparse lists ---------------------------------------------------------------------------

    @abc.abstractmethod
    def encode(
        self, lists: Sequence[tuple], with_counts: bool, span: int | None = None
    ) -> torch.Tensor:
        """Return one message holding the (indices, values) ``lists``.

        Indices may be int32 or int64 (each below 2^31); the fp32 codec carries the counts only
        ``with_counts``, compact codecs always. ``span``: every list ascends in ``[0,
        span)``, which lets a compact codec send 16-bit offsets without a read (docs/DESIGN.md,
        "The wire"); ``None``: lists of any order, int32 indices. The receiver passes the same.
        """

    @abc.abstractmethod
    def decode(
        self,
        message: torch.Tensor,
        items: int,
        sizes: Sequence[int] | None = None,
        span: int | None = None,
    ):
        """Return the ``items`` (int32 indices, float32 values) lists of a message.

        ``sizes``: their lengths, where they are known (an fp32 message without counts needs
        them; ``None``: read from the message's counts, one read). ``span`` as the sender's
        :meth:`encode` had it.

        Raises:
            RuntimeError: the message does not fit.
        """

    def quantize_row(self, values: torch.Tensor) -> torch.Tensor:
        """Return the 1-D ``values`` as :meth:`quantize` gives them, without a read.

        One row of :meth:`quantize_rows`: the values must be finite (:meth:`quantize` refuses
        others).
        """
        return self.quantize_rows(values.view(1, -1)).view(-1)

    def row_exponents(self, values: torch.Tensor, largest=None) -> torch.Tensor:
        """Return each row's :meth:`exponent` of the ``(r, w)`` ``values``, as int32 ``(r,)``.

        ``largest``: each row's largest magnitude (float32 ``(r,)``), where the caller has it.
        """
        return self.format.row_exponents(values, largest)

    def quantize_rows(self, values: torch.Tensor, exponents: torch.Tensor | None = None):
        """Return each row of the ``(r, w)`` ``values`` as :meth:`quantize` gives it alone.

        A fixed number of operations and no read of the data, whatever r is; the rows must be
        finite (fp16: a row with NaN or inf travels as what its scaling makes of it, which the
        next selection refuses). ``exponents``: each row's :meth:`row_exponents` (``None``:
        those of ``values``); given those of other rows, each entry comes out as it did in
        them (quantization is per entry, once the exponent is known).
        """
        return self.format.quantize_rows(values, exponents)

    @abc.abstractmethod
    def rows_size(self, rows: int, width: int, span: int) -> int:
        """Return the length (in ``recv_dtype`` elements) of an :meth:`encode_rows` message.

        Fixed by the shape: ``rows`` lists of ``width`` entries whose columns lie in
        ``[0, span)``.
        """

    @abc.abstractmethod
    def encode_rows(
        self,
        columns: torch.Tensor,
        values: torch.Tensor,
        span: int,
        exponents: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return one message holding the rows of ``(r, w)`` ``columns`` and ``values`` as r lists.

        Columns lie in ``[0, span)`` and each row's are non-decreasing (SparDL's tables are
        ascending, padded by repeating the last entry). The message has :meth:`rows_size`
        elements; a fixed number of operations and no read of the data, whatever r is.
        ``exponents``: the rows' :meth:`row_exponents` where the caller has them (those it
        quantized the values with), else ``None``: computed from ``values``. ``out``: a
        buffer of :meth:`rows_size` ``recv_dtype`` elements to write the message in (a
        synchronizer's, reused each call), else a new one.
        """

    @abc.abstractmethod
    def decode_rows(self, message: torch.Tensor, rows: int, width: int, span: int) -> tuple:
        """Return the ``(rows, width)`` (int32 columns, float32 values) of an :meth:`encode_rows`.

        Raises:
            RuntimeError: the message is not of :meth:`rows_size`.
        """

    @abc.abstractmethod
    def decode_one(self, message: torch.Tensor, span: int | None = None) -> tuple:
        """Return the (indices, values) of a message encoded from one list without counts.

        Its length tells its count: no read.
        """

    @abc.abstractmethod
    def encode_parts(
        self,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Sequence[int],
        home: int,
        span: int | None = None,
    ) -> list:
        """Return one one-list message per part of consecutive entries of sizes ``counts``.

        Part p is entries ``sum(counts[:p]) ..`` of ``(indices, values)``; its message is what
        :meth:`encode` makes of that list without counts (``span`` as there). Part ``home``
        does not travel: a compact codec encodes nothing for it (``None``). The messages are
        views of one buffer made by one ``cat`` of the parts' pieces, each cut by one ``split``:
        a fixed number of operations and no read, whatever the number of parts.
        """

    def quantize_encode_parts(
        self,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Sequence[int],
        home: int,
        span: int | None = None,
    ) -> tuple:
        """Return ``(sent, messages)``: :meth:`quantize_parts` then :meth:`encode_parts`.

        ``sent`` is ``values`` with every part but ``home`` quantized; ``messages`` the parts'
        messages of ``sent`` (``None`` for ``home``). A compact codec computes each part's
        exponent and 16-bit values once for both.
        """
        sent = self.quantize_parts(values, counts, home)
        return sent, self.encode_parts(indices, sent, counts, home, span)

    @abc.abstractmethod
    def decode_joined(self, items: Sequence, span: int | None = None) -> tuple:
        """Return the lists of ``items``, joined in order, and their lengths.

        An item is a one-list message (:meth:`decode_one`, ``span`` as its sender's) or an
        ``(indices, values)`` list that did not travel. Returns ``(int32 indices, float32
        values, sizes)``: the messages are joined by one ``cat`` and cut by one ``split``, sized
        by their lengths; a fixed number of operations and no read, whatever their number.

        Raises:
            RuntimeError: a message that fits no list.
        """

    def message_at(self, words: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Return bytes ``start`` to ``end`` of the int32 ``words`` as a message of this codec.

        A view, of the codec's ``recv_dtype``: a message carried inside a larger int32 one.
        """
        return words.view(torch.uint8)[start:end]

    def messages_in(self, words: torch.Tensor, sizes: Sequence[int]) -> tuple:
        """Return the consecutive pieces of ``sizes`` bytes of the int32 ``words``, as messages.

        Views of the codec's ``recv_dtype`` (:meth:`message_at` of each piece), made by one
        ``split``: the sizes cover all of ``words``' bytes, each a whole number of elements.
        """
        unit = torch.iinfo(self.recv_dtype).bits // 8
        if words.dtype != self.recv_dtype:
            words = words.view(self.recv_dtype)
        return words.split([size // unit for size in sizes])

    # Dense values ---------------------------------------------------------------------------

    @abc.abstractmethod
    def encode_values(self, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return one message holding the float32 tensors ``pieces`` (no indices).

        fp32: their bits as int32. Compact: each piece's exponent, then the 16-bit values.
        """

    @abc.abstractmethod
    def values_bytes(self, sizes: Sequence[int]) -> int:
        """Return the bytes of an :meth:`encode_values` message of pieces of lengths ``sizes``."""

    @abc.abstractmethod
    def decode_values(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return the float32 pieces of lengths ``sizes`` of an :meth:`encode_values` message.

        Raises:
            RuntimeError: the message does not fit.
        """

    def decode_values_joined(self, messages: Sequence[torch.Tensor], sizes: Sequence[int]):
        """Return the float32 values of one-piece :meth:`encode_values` ``messages``, joined.

        Message i holds a piece of ``sizes[i]`` values.

        Raises:
            RuntimeError: the messages do not fit.
        """
        return torch.cat(
            [self.decode_values(message, [size])[0] for message, size in zip(messages, sizes)]
        )

    # Dense regions: the values of encode_values in pieces of PIECE, the last one shorter ------

    @abc.abstractmethod
    def encode_region(self, values: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Return the message of one dense region: ``values`` as :meth:`encode_values` codes them.

        In pieces of :data:`PIECE` values (the last one shorter), without a read: the pieces'
        exponents (none at fp32), then their values. Where ``residual``, ``values`` then hold
        what the wire took off them (at fp32 nothing: they stay as they are). A fixed number of
        operations per region, and no list number per entry (as the pieces of
        :meth:`encode_values` need): how ``dense`` and TopkDSA's dense gather move their regions.
        """

    @abc.abstractmethod
    def split_regions(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return the ``(head, body)`` (views) of each region of a region message.

        A message of :meth:`encode_region` or :meth:`join_regions`, of regions of ``sizes``
        values; ``head``: their exponents' words, ``body``: their values'.

        Raises:
            RuntimeError: the message does not fit.
        """

    @abc.abstractmethod
    def join_regions(self, coded: Sequence[tuple]) -> torch.Tensor:
        """Return one message of :meth:`split_regions` regions, in order, to forward them.

        The :meth:`encode_values` message of all their pieces: the heads, then the bodies.
        """

    @abc.abstractmethod
    def decode_region(self, coded: tuple, out: torch.Tensor, add: bool = False) -> torch.Tensor:
        """Write (or with ``add``, add) the float32 values of a split region into ``out``."""


class Fp32Codec(Codec):
    """The fp32 wire: int32 messages ``[counts] | indices | value bits``, bit for bit."""

    wire = "fp32"

    def quantize_parts(self, values: torch.Tensor, counts: Sequence[int], kept: int):
        """Return ``values`` itself: fp32 carries their bits."""
        return values

    def encode(
        self, lists: Sequence[tuple], with_counts: bool, span: int | None = None
    ) -> torch.Tensor:
        """Return the int32 message ``[counts] | indices | value bits`` of ``lists``."""
        counts = [len(idx) for idx, _ in lists]
        total = sum(counts)
        head = len(counts) if with_counts else 0
        device = lists[0][0].device if lists else torch.device("cpu")
        message = torch.empty(head + 2 * total, dtype=torch.int32, device=device)
        if with_counts:
            message[:head] = device_tensor(counts, torch.int32, device)
        indices = message[head : head + total]
        values = message[head + total :].view(torch.float32)
        start = 0
        for (idx, val), count in zip(lists, counts):
            indices[start : start + count] = idx
            values[start : start + count] = val
            start += count
        return message

    def decode(
        self,
        message: torch.Tensor,
        items: int,
        sizes: Sequence[int] | None = None,
        span: int | None = None,
    ):
        """Return the lists of an :meth:`encode` message (views of it)."""
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

    def rows_size(self, rows: int, width: int, span: int) -> int:
        """Return the int32 words of the rows' message: an index and a value per entry."""
        return 2 * rows * width

    def encode_rows(self, columns, values, span: int, exponents=None, out=None) -> torch.Tensor:
        """Return the rows' message ``indices | value bits`` in two copies."""
        size = columns.numel()
        message = message_buffer(out, 2 * size, torch.int32, values.device)
        message[:size].view(columns.shape).copy_(columns)
        message[size:].view(torch.float32).view(values.shape).copy_(values)
        return message

    def decode_rows(self, message: torch.Tensor, rows: int, width: int, span: int) -> tuple:
        """Return the rows of an :meth:`encode_rows` message, as views."""
        size = rows * width
        if message.numel() != 2 * size:
            raise RuntimeError(f"malformed message: {message.numel()} words for {size} entries")
        values = message[size:].view(torch.float32)
        return message[:size].view(rows, width), values.view(rows, width)

    def decode_one(self, message: torch.Tensor, span: int | None = None) -> tuple:
        """Return the halves of a one-list message without counts, as views."""
        count = message.numel() // 2
        return message[:count], message[count:].view(torch.float32)

    def encode_parts(
        self,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Sequence[int],
        home: int,
        span: int | None = None,
    ) -> list:
        """Return the parts' messages: views of one buffer made by one ``cat``.

        One ``split`` of the indices, one of the values and one of the buffer: a fixed number
        of operations, whatever the number of parts.
        """
        counts = list(counts)
        words, bits = covered(indices, counts).to(torch.int32), covered(values, counts)
        pairs = zip(words.split(counts), bits.view(torch.int32).split(counts))
        buffer = torch.cat([piece for pair in pairs for piece in pair])
        return list(buffer.split([2 * count for count in counts]))

    def decode_joined(self, items: Sequence, span: int | None = None) -> tuple:
        """Return the lists of ``items``, joined in order, and their lengths.

        The messages are joined by one ``cat`` and cut into their halves by one ``split``;
        then two ``cat`` of the halves, the lists that did not travel among them: a fixed
        number of operations, whatever the number of messages.

        Raises:
            RuntimeError: a message of an odd number of words.
        """
        messages = [item for item in items if not isinstance(item, tuple)]
        for message in messages:
            if message.numel() % 2:
                raise RuntimeError(f"malformed message: {message.numel()} words")
        if not items:
            return torch.empty(0, dtype=torch.int32), torch.empty(0), []
        if messages:  # int32 words already: their halves, one after another
            halves = [message.numel() // 2 for message in messages for _ in range(2)]
            cut = iter(torch.cat(messages).split(halves))
        indices, words = [], []  # words: the values' bits, as int32
        for item in items:
            if isinstance(item, tuple):
                pair = (item[0].to(torch.int32), item[1].view(torch.int32))
            else:
                pair = (next(cut), next(cut))
            indices.append(pair[0])
            words.append(pair[1])
        sizes = [part.numel() for part in indices]
        return torch.cat(indices), torch.cat(words).view(torch.float32), sizes

    def message_at(self, words: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Return words ``start // 4`` to ``end // 4`` of ``words`` (a view)."""
        return words[start // 4 : end // 4]

    def encode_values(self, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return the bits of ``pieces``, joined, as int32."""
        return torch.cat(list(pieces)).view(torch.int32)

    def values_bytes(self, sizes: Sequence[int]) -> int:
        """Return 4 bytes per value."""
        return 4 * sum(sizes)

    def decode_values(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return the pieces of an :meth:`encode_values` message, as views."""
        if message.numel() != sum(sizes):
            raise RuntimeError(f"malformed message: {message.numel()} elements for {sizes}")
        return list(torch.split(message.view(torch.float32), list(sizes)))

    def decode_values_joined(self, messages: Sequence[torch.Tensor], sizes: Sequence[int]):
        """Return the messages' words joined, as float32: one ``cat``."""
        joined = torch.cat(list(messages))  # the values' words, one after another
        if joined.numel() != sum(sizes):
            raise RuntimeError(f"malformed message: {joined.numel()} words for {sum(sizes)} values")
        return joined.view(torch.float32)

    def encode_region(self, values: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Return the bits of ``values`` as int32 words: nothing is lost."""
        return values.view(torch.int32)

    def split_regions(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return each region's ``(no words, words)``."""
        if message.numel() != sum(sizes):
            raise RuntimeError(f"malformed message: {message.numel()} elements for {sizes}")
        return [(message[:0], body) for body in message.split(list(sizes))]

    def join_regions(self, coded: Sequence[tuple]) -> torch.Tensor:
        """Return the regions' words, joined."""
        return torch.cat([body for _, body in coded])

    def decode_region(self, coded: tuple, out: torch.Tensor, add: bool = False) -> torch.Tensor:
        """Copy (or add) the region's values into ``out``."""
        values = coded[1].view(torch.float32)
        return out.add_(values) if add else out.copy_(values)
