"""The codec seam: how sparse lists and dense values travel (docs/DESIGN.md, section "The wire").

``codec(wire)`` returns the :class:`Codec` of a wire format: ``"fp32"`` (int32 indices, float32
values, the original layout, bit for bit), ``"fp16"`` or ``"bf16"`` (16-bit values, indices as
16-bit offsets where they fit). Each format is a class of its own (:class:`Fp32Codec`, and the
compact :class:`Fp16Codec` and :class:`Bf16Codec`); ``Codec(wire)`` builds the one of
``wire``. Methods hand ``(indices, values)`` lists to the engine; only the wire knows the
bytes, also of ZEN's partitions (:class:`PartitionCodec`: an owner's indices as a list or as
a bitmap over the indices it owns).
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from .checks import check_choice

__all__ = [
    "WIRES",
    "PIECE",
    "check_wire",
    "codec",
    "Codec",
    "Fp32Codec",
    "CompactCodec",
    "Fp16Codec",
    "Bf16Codec",
    "device_tensor",
    "byte_view",
    "PARTITION_INDEX",
    "COO",
    "BITMAP",
    "bitmap_words",
    "bitmap_padded",
    "choose_form",
    "pack_bits",
    "unpack_bits",
    "Partition",
    "PartitionCodec",
]

#: The wire formats, by name.
WIRES = ("fp32", "fp16", "bf16")

_SEGMENT = 1 << 16  # the span one 16-bit offset covers
#: Values per exponent of a dense region at a 16-bit wire (:meth:`Codec.encode_region`).
PIECE = 1 << 16
_FP16_MAX = float(torch.finfo(torch.float16).max)
_LOWEST_EXPONENT = -125  # below it a decoded fp16 value times 2^e could round in float32


def check_wire(wire) -> str:
    """Return ``wire`` if it names a wire format.

    Raises:
        ValueError: it does not; the message names the valid ones.
    """
    return check_choice("wire", wire, WIRES, "not a wire format")


def codec(wire: str = "fp32") -> Codec:
    """Return the codec of wire format ``wire`` (one of :data:`WIRES`).

    Raises:
        ValueError: an unknown wire format.
    """
    return _CODECS[check_wire(wire)]


def _head(tensor: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Return the entries of ``tensor`` that parts of sizes ``counts`` cover: all, usually."""
    total = sum(counts)
    return tensor if total == tensor.numel() else tensor[:total]


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

    def __new__(cls, wire: str | None = None):
        """Return a new codec of the class of ``wire`` (default: the class's own, or fp32)."""
        kind = _KINDS[check_wire(wire if wire is not None else cls.wire or "fp32")]
        if not issubclass(kind, cls):
            raise ValueError(f"{cls.__name__} is not the codec of wire={wire!r}")
        return super().__new__(kind)

    def __getnewargs__(self) -> tuple:
        return (self.wire,)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.wire!r})"

    # Values ---------------------------------------------------------------------------------

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire.

        0 but at fp16 (:meth:`Fp16Codec.exponent`).
        """
        return 0

    @abc.abstractmethod
    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` as a receiver decodes them when they travel as one list.

        The identity for fp32 (``values`` itself). Quantizing what this returns gives the same
        bits again, also for any sub-list of it, so a value forwarded keeps its bits.

        Raises:
            ValueError: ``values`` hold NaN or inf (fp16), or a bf16 value overflows.
        """

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
        return torch.zeros(values.shape[0], dtype=torch.int32, device=values.device)

    def quantize_rows(self, values: torch.Tensor, exponents: torch.Tensor | None = None):
        """Return each row of the ``(r, w)`` ``values`` as :meth:`quantize` gives it alone.

        A fixed number of operations and no read of the data, whatever r is; the rows must be
        finite (fp16: a row with NaN or inf travels as what its scaling makes of it, which the
        next selection refuses). ``exponents``: each row's :meth:`row_exponents` (``None``:
        those of ``values``); given those of other rows, each entry comes out as it did in
        them (quantization is per entry, once the exponent is known).
        """
        return values

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

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` itself: fp32 carries their bits."""
        return values

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
        message = _message(out, 2 * size, torch.int32, values.device)
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
        words, bits = _head(indices, counts).to(torch.int32), _head(values, counts)
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


class CompactCodec(Codec):
    """A 16-bit wire: uint8 messages (layout in docs/DESIGN.md, section "The wire").

    Its subclasses :class:`Fp16Codec` and :class:`Bf16Codec` differ in the values only. Lists
    are coded on the device: each list's exponent comes from the bits of its largest magnitude,
    offsets from fixed segments of the lists' span, and a message's sizes from its length or its
    counts; so nothing but a message's counts (where the receiver cannot know the sizes) is read
    back from the device. The values must be finite (on the CPU the selection refuses NaN and
    inf before they reach a message; :meth:`quantize` refuses them itself).
    """

    compact = True
    recv_dtype = torch.uint8
    #: The values' dtype on the wire.
    _half: torch.dtype

    def quantize(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` through 16 bits and back, scaled by the list's exponent."""
        exponent = self.exponent(values)
        return self._from_half(self._to_half(values, exponent), exponent)

    def _to_half(self, values: torch.Tensor, exponent: int) -> torch.Tensor:
        if exponent:
            values = values * math.ldexp(1.0, -exponent)
        return values.to(self._half)

    @staticmethod
    def _from_half(half: torch.Tensor, exponent: int) -> torch.Tensor:
        values = half.float()
        return values.mul_(math.ldexp(1.0, exponent)) if exponent else values

    def quantize_parts(self, values: torch.Tensor, counts: Sequence[int], kept: int):
        """Return a copy of ``values`` with each part but ``kept`` quantized alone, without a read.

        All parts at once: a fixed number of operations, whatever their number.
        """
        return self._sent(values, list(counts), kept, self._parts_half(values, list(counts)))

    def _parts_half(self, values: torch.Tensor, counts: list, quantizing: bool = True) -> tuple:
        """Return ``(lists, exponents, half)`` of the parts ``counts`` of ``values``.

        ``half``: the 16-bit values, checked (:meth:`_quantized`) where ``quantizing``.
        """
        head, lists = _head(values, counts), _Lists(counts, values.device)
        exponents = self._list_exponents(head, lists)
        half = self._lists_to_half(head, exponents, lists)
        return lists, exponents, self._quantized(half) if quantizing else half

    def _sent(self, values: torch.Tensor, counts: list, kept: int, coded: tuple):
        """Return :meth:`quantize_parts`'s result from the parts' :meth:`_parts_half`."""
        lists, exponents, half = coded
        total = sum(counts)
        sent = self._lists_from_half(half, exponents, lists)
        if 0 <= kept < len(counts) and counts[kept]:
            start = sum(counts[:kept])
            sent[start : start + counts[kept]] = values[start : start + counts[kept]]
        if total != values.numel():
            sent = torch.cat([sent, values[total:]])  # what no part covers, as it is
        return sent

    def _quantized(self, half: torch.Tensor) -> torch.Tensor:
        """Return the 16-bit values of a quantization, checked where the format asks (bf16).

        Only quantization checks: a sender quantizes what it sends before it uses it (the
        rule every method keeps), so the encoders take values that passed already.
        """
        return half

    def _list_exponents(self, values: torch.Tensor, lists: _Lists) -> torch.Tensor:
        """Return the :meth:`exponent` of each of the joined ``lists`` of ``values``, as int32.

        Computed on the device, as :meth:`row_exponents`: no read.
        """
        return torch.zeros(len(lists.counts), dtype=torch.int32, device=values.device)

    def _rows_to_half(self, values: torch.Tensor, up: torch.Tensor, out=None):
        """Return row i of ``values`` divided by 2^e_i, in 16 bits (written into ``out``).

        ``up``: the rows' 2^e_i, ``(r, 1)`` float32 (:func:`_row_powers`). Dividing by 2^e gives
        the bits multiplying by 2^-e gave: both are the one rounding of the same exact value.
        """
        if out is None:
            out = torch.empty(values.shape, dtype=self._half, device=values.device)
        return torch.div(values, up, out=out)

    @staticmethod
    def _rows_from_half(half: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        # One pass: the 16-bit values are widened as they are multiplied (float32 is the
        # common type), the same bits as widening first.
        return torch.mul(half, up)

    def _lists_to_half(self, values, exponents: torch.Tensor, lists: _Lists):
        """Return the joined ``lists`` of ``values``, list j divided by 2^e_j, in 16 bits."""
        return (values / lists.spread(_powers_of_two(exponents))).to(self._half)  # as rows

    @staticmethod
    def _lists_from_half(half: torch.Tensor, exponents: torch.Tensor, lists: _Lists):
        """Return the joined 16-bit ``lists`` ``half`` as float32, list j times 2^e_j."""
        return torch.mul(half, lists.spread(_powers_of_two(exponents)))  # widened as multiplied

    def quantize_rows(self, values: torch.Tensor, exponents: torch.Tensor | None = None):
        """Return each row through 16 bits and back, scaled by its exponent: no read of data."""
        if exponents is None:
            exponents = self.row_exponents(values)
        up = _row_powers(exponents)
        return self._rows_from_half(self._quantized(self._rows_to_half(values, up)), up)

    def rows_size(self, rows: int, width: int, span: int) -> int:
        """Return the bytes of the rows' message (docs/DESIGN.md, "The wire")."""
        return 4 * rows * (1 + _segments(span)) + 4 * rows * width

    def encode_rows(self, columns, values, span: int, exponents=None, out=None) -> torch.Tensor:
        """Return the rows' fixed-size uint8 message (docs/DESIGN.md, "The wire").

        ``[e_1..e_r | segment counts | 16-bit low columns | 16-bit values]``: the counts (of
        each row's columns per 65,536-wide segment of ``span``, r x S int32) travel only where
        ``span`` > 65,536 and let the receiver restore the high bits of the non-decreasing rows.
        """
        rows, width = values.shape
        segments = _segments(span)
        message = _message(out, self.rows_size(rows, width, span), torch.uint8, values.device)
        head = 4 * rows * (1 + segments)
        words = message[:head].view(torch.int32)
        if exponents is None:
            exponents = self.row_exponents(values)
        words[:rows] = exponents
        if segments:  # the rows ascend: a binary search of each row for the segments' edges
            edges = _segment_edges(segments, columns.dtype, columns.device, rows)
            found = torch.searchsorted(columns.contiguous(), edges)
            words[rows:].view(rows, segments).copy_(found.diff(dim=1))
        entries = rows * width
        low = message[head : head + 2 * entries].view(torch.int16).view(rows, width)
        torch.bitwise_and(columns, 0xFFFF, out=low)  # the low 16 bits, no temporary
        halves = message[head + 2 * entries :].view(self._half).view(rows, width)
        self._rows_to_half(values, _row_powers(exponents), out=halves)
        return message

    def decode_rows(self, message: torch.Tensor, rows: int, width: int, span: int) -> tuple:
        """Return the int32 columns and float32 values of an :meth:`encode_rows` message."""
        size = self.rows_size(rows, width, span)
        if message.numel() != size:
            raise RuntimeError(f"malformed message: {message.numel()} bytes, expected {size}")
        segments = _segments(span)
        head = 4 * rows * (1 + segments)
        words = message[:head].view(torch.int32)
        entries = rows * width
        low = message[head : head + 2 * entries].view(torch.int16)
        high = words[rows:] if segments else None
        columns = _restore_high(low, high, rows, segments, entries)
        halves = message[head + 2 * entries :].view(self._half).view(rows, width)
        return columns.view(rows, width), self._rows_from_half(halves, _row_powers(words[:rows]))

    # Lists of any length: [counts] | exponents | [segment counts] | indices | values ----------

    def encode(
        self, lists: Sequence[tuple], with_counts: bool, span: int | None = None
    ) -> torch.Tensor:
        """Return the uint8 message of ``lists`` (docs/DESIGN.md, "The wire"): no read."""
        device = lists[0][1].device if lists else torch.device("cpu")
        counts = [int(values.numel()) for _, values in lists]
        if lists:
            indices = torch.cat([idx.to(device=device) for idx, _ in lists])
            values = torch.cat([values for _, values in lists])
        else:
            indices = torch.empty(0, dtype=torch.int64, device=device)
            values = torch.empty(0, device=device)
        coded = self._coded(indices, values, counts, span)
        return torch.cat([_int32_bytes(counts, device), *coded])

    def _coded(self, indices, values, counts: Sequence[int], span: int | None) -> list:
        """Return the byte pieces ``exponents | [segment counts] | indices | values`` of lists."""
        lists, exponents, half = self._parts_half(values, list(counts), quantizing=False)
        halves = byte_view(half)
        if not _offsets_form(span, len(counts), sum(counts)):
            return [byte_view(exponents), _index_bytes(indices, 4), halves]
        segments = _segment_counts(indices, lists, _segments(span))
        return [byte_view(exponents), segments, _index_bytes(indices, 2), halves]

    def decode(
        self,
        message: torch.Tensor,
        items: int,
        sizes: Sequence[int] | None = None,
        span: int | None = None,
    ):
        """Return the lists of an :meth:`encode` message, values as float32.

        Its counts are read (one read) only where ``sizes`` are not given; the length is checked.
        """
        head = 4 * items
        if message.numel() < head:
            raise RuntimeError(f"malformed message: expected {items} lists")
        if sizes is None:
            sizes = message[:head].view(torch.int32).tolist() if items else []
        counts = list(sizes)
        if min(counts, default=0) < 0:
            raise RuntimeError(f"malformed message: sizes {counts}")
        expected = head + _lists_bytes(counts, span)
        if message.numel() != expected:
            raise RuntimeError(
                f"malformed message: {message.numel()} bytes for {sum(counts)} entries, "
                f"expected {expected}"
            )
        indices, values = self._decoded([message], [counts], span)
        if items == 1:
            return [(indices, values)]
        return list(zip(indices.split(counts), values.split(counts)))

    def decode_one(self, message: torch.Tensor, span: int | None = None) -> tuple:
        """Return the (indices, values) of a one-list message: no read (its length tells)."""
        return self.decode(message, 1, [_one_count(message.numel(), span)], span)[0]

    def _decoded(self, messages: Sequence, counts: Sequence, span: int | None) -> tuple:
        """Return the int32 indices and float32 values of ``messages``, joined.

        ``counts[i]``: message i's list sizes (its length checked). One ``cat`` of the messages
        and one ``split`` into counts, exponents, segment counts, indices and values; offsets
        restored by one ``repeat_interleave`` and values scaled on the device: no read.
        """
        forms = [_offsets_form(span, len(sizes), sum(sizes)) for sizes in counts]
        segments = _segments(span) if span is not None else 0
        cuts = []
        for sizes, offsets in zip(counts, forms):
            total = sum(sizes)
            cuts += [4 * len(sizes), 4 * len(sizes), 4 * len(sizes) * segments if offsets else 0]
            cuts += [(2 if offsets else 4) * total, 2 * total]
        pieces = (torch.cat(list(messages)) if len(messages) > 1 else messages[0]).split(cuts)
        lists = _Lists([size for sizes in counts for size in sizes], pieces[0].device)
        exponents = torch.cat(pieces[1::5]).view(torch.int32)
        values = self._lists_from_half(torch.cat(pieces[4::5]).view(self._half), exponents, lists)
        totals = [sum(sizes) for sizes in counts]
        # Each form's indices at once (joined, so aligned), then back in the messages' order.
        decoded = {}
        for offsets in sorted(set(forms)):
            at = [body for body, form in enumerate(forms) if form == offsets]
            joined = torch.cat([pieces[3 + 5 * body] for body in at])
            if offsets:
                rows = sum(len(counts[body]) for body in at)
                high = torch.cat([pieces[2 + 5 * body] for body in at]).view(torch.int32)
                joined = _restore_high(
                    joined.view(torch.int16), high, rows, segments, joined.numel() // 2
                )
            else:
                joined = joined.view(torch.int32)
            decoded[offsets] = iter(joined.split([totals[body] for body in at]))
        indices = [next(decoded[offsets]) for offsets in forms]
        return (indices[0] if len(indices) == 1 else torch.cat(indices)), values

    def encode_parts(
        self,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Sequence[int],
        home: int,
        span: int | None = None,
    ) -> list:
        """Return each part's own message, ``None`` for part ``home``.

        All parts coded at once (:meth:`encode`'s pieces, each cut by one ``split``), then
        joined by one ``cat`` and cut into the messages: no read.
        """
        counts = list(counts)
        coded = self._parts_half(values, counts, quantizing=False)  # quantized already
        return self._part_messages(indices, counts, home, span, coded)

    def quantize_encode_parts(
        self,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Sequence[int],
        home: int,
        span: int | None = None,
    ) -> tuple:
        """See :meth:`Codec.quantize_encode_parts`: the exponents and halves made once.

        The messages differ from :meth:`encode_parts` of ``sent`` in one case only: where a
        part's largest value rounds down to 65,504 x 2^(e-1), they carry exponent e and that
        e - 1, with the same decoded values.
        """
        counts = list(counts)
        coded = self._parts_half(values, counts)
        sent = self._sent(values, counts, home, coded)
        return sent, self._part_messages(indices, counts, home, span, coded)

    def _part_messages(self, indices, counts: list, home: int, span, coded: tuple) -> list:
        """Return :meth:`encode_parts`'s messages from the parts' ``(lists, exponents, half)``."""
        lists, exponents, half = coded
        indices, halves = _head(indices, counts), byte_view(half)
        forms = [_offsets_form(span, 1, count) for count in counts]
        cut = {"c": _int32_bytes(counts, half.device).split(4)}
        cut["e"] = byte_view(exponents).split(4)
        cut["v"] = halves.split([2 * count for count in counts])
        if any(forms):
            segments = _segments(span)
            table = _segment_counts(indices, lists, segments)
            cut["s"] = table.split(4 * segments) if segments else [table] * len(counts)
            cut["o"] = _index_bytes(indices, 2).split([2 * c for c in counts])
        if not all(forms):
            cut["i"] = _index_bytes(indices, 4).split([4 * c for c in counts])
        pieces, sizes = [], []
        for part, offsets in enumerate(forms):
            if part == home:
                continue
            kinds = ("c", "e", "s", "o", "v") if offsets else ("c", "e", "i", "v")
            pieces += [cut[kind][part] for kind in kinds]
            sizes.append(sum(cut[kind][part].numel() for kind in kinds))
        if not pieces:
            return [None] * len(counts)
        messages = iter(torch.cat(pieces).split(sizes))
        return [None if part == home else next(messages) for part in range(len(counts))]

    def decode_joined(self, items: Sequence, span: int | None = None) -> tuple:
        """Return the lists of ``items``, joined in order, and their lengths (see Codec)."""
        messages = [item for item in items if not isinstance(item, tuple)]
        counts = [_one_count(message.numel(), span) for message in messages]
        if messages:
            indices, values = self._decoded(messages, [[count] for count in counts], span)
            travelled = iter(zip(indices.split(counts), values.split(counts)))
        parts = [
            (item[0].to(torch.int32), item[1]) if isinstance(item, tuple) else next(travelled)
            for item in items
        ]
        if not parts:
            return torch.empty(0, dtype=torch.int32), torch.empty(0), []
        sizes = [part[1].numel() for part in parts]
        return torch.cat([i for i, _ in parts]), torch.cat([v for _, v in parts]), sizes

    # Dense values -----------------------------------------------------------------------------

    def encode_values(self, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
        """Return the pieces' exponents, then their 16-bit values, as bytes: no read."""
        device = pieces[0].device if pieces else torch.device("cpu")
        sizes = [piece.numel() for piece in pieces]
        values = torch.cat(list(pieces)) if pieces else torch.empty(0, device=device)
        _, exponents, half = self._parts_half(values, sizes, quantizing=False)
        return torch.cat([byte_view(exponents), byte_view(half)])

    def values_bytes(self, sizes: Sequence[int]) -> int:
        """Return 4 bytes per piece (its exponent) and 2 per value."""
        return 4 * len(sizes) + 2 * sum(sizes)

    def decode_values(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return the float32 pieces of an :meth:`encode_values` message: no read."""
        sizes = list(sizes)
        head = 4 * len(sizes)
        if message.numel() != head + 2 * sum(sizes):
            raise RuntimeError(f"malformed message: {message.numel()} elements for {sizes}")
        exponents = message[:head].view(torch.int32)
        lists = _Lists(sizes, message.device)
        values = self._lists_from_half(message[head:].view(self._half), exponents, lists)
        return [values] if len(sizes) == 1 else list(values.split(sizes))

    def decode_values_joined(self, messages: Sequence[torch.Tensor], sizes: Sequence[int]):
        """Return the float32 values of one-piece :meth:`encode_values` messages, joined.

        Several messages are joined by one ``cat`` and cut into exponents and 16-bit values by
        one ``split``; each piece is scaled by its exponent on the device: a fixed number of
        operations and no read of the data, whatever the number of messages.
        """
        pairs = list(zip(messages, sizes))
        for message, size in pairs:
            if message.numel() != 4 + 2 * size:
                raise RuntimeError(f"malformed message: {message.numel()} elements for {[size]}")
        if len(pairs) < 2:
            return super().decode_values_joined(messages, sizes)
        joined = torch.cat([message for message, _ in pairs])
        cut = joined.split([piece for _, size in pairs for piece in (4, 2 * size)])
        exponents = torch.cat(cut[0::2]).view(torch.int32)
        # 2^e is exact in float32, and so is every product (e >= -125): the bits of _from_half.
        lists = _Lists([size for _, size in pairs], joined.device)
        return self._lists_from_half(torch.cat(cut[1::2]).view(self._half), exponents, lists)

    def encode_region(self, values: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Return the pieces' exponents and 16-bit values as one uint8 message, without a read.

        The pieces are at most two 2-D views (:func:`_piece_rows`), each scaled by a column of
        powers of two and written straight into the message: the bits of
        :meth:`quantize_parts` and :meth:`encode_values`, with no index per entry.
        """
        rows = _piece_rows(values)
        head = 4 * _piece_count(values.numel())
        message = torch.empty(head + 2 * values.numel(), dtype=torch.uint8, device=values.device)
        if not rows:
            return message
        exponents = message[:head].view(torch.int32)
        exponents.copy_(torch.cat([self.row_exponents(part) for part in rows]))
        half = message[head:].view(self._half)
        counts = [part.shape[0] for part in rows]
        upper = _row_powers(exponents).split(counts)  # divided by (as rows), then multiplied
        for part, half_part, scale in zip(rows, _piece_rows(half), upper):
            torch.div(part, scale, out=half_part)
        self._quantized(half)
        if residual:
            for part, half_part, scale in zip(rows, _piece_rows(half), upper):
                part.addcmul_(half_part, scale, value=-1)
        return message

    def split_regions(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return each region's ``(head, body)``: views of its exponents' and values' bytes."""
        pieces = [_piece_count(size) for size in sizes]
        cuts = [4 * count for count in pieces] + [2 * size for size in sizes]
        if message.numel() != sum(cuts):
            raise RuntimeError(f"malformed message: {message.numel()} bytes for {list(sizes)}")
        parts = message.split(cuts)
        return list(zip(parts[: len(sizes)], parts[len(sizes) :]))

    def join_regions(self, coded: Sequence[tuple]) -> torch.Tensor:
        """Return the regions' heads, then their bodies, as one uint8 message."""
        return torch.cat([head for head, _ in coded] + [body for _, body in coded])

    def decode_region(self, coded: tuple, out: torch.Tensor, add: bool = False) -> torch.Tensor:
        """Write (or add) each piece times 2^e into ``out``: one operation per 2-D view."""
        head, body = coded
        rows = _piece_rows(out)
        upper = _row_powers(head.view(torch.int32))
        halves = _piece_rows(body.view(self._half))
        for part, half_part, scale in zip(rows, halves, upper.split([p.shape[0] for p in rows])):
            if add:
                part.addcmul_(half_part, scale)
            else:
                torch.mul(half_part, scale, out=part)
        return out


def _piece_count(size: int) -> int:
    """Return the pieces of :data:`PIECE` values (the last one shorter) of ``size`` values."""
    return -(-size // PIECE)


def _piece_rows(values: torch.Tensor) -> list:
    """Return the 1-D ``values``' pieces of :data:`PIECE` as at most two 2-D views.

    The full pieces as ``(m, PIECE)`` and the last, shorter one as ``(1, r)``; none if empty.
    """
    full = values.numel() // PIECE
    rows = [values[: full * PIECE].view(full, PIECE)] if full else []
    if values.numel() > full * PIECE:
        rows.append(values[full * PIECE :].view(1, -1))
    return rows


class Fp16Codec(CompactCodec):
    """The fp16 wire: float16 values, scaled by a power of two per list."""

    wire = "fp16"
    _half = torch.float16

    def exponent(self, values: torch.Tensor) -> int:
        """Return the power of two e by which a list's ``values`` are divided on the wire.

        The ``e`` that puts the largest magnitude in [2^15, 65504] (at least -125), so nothing
        overflows and small lists keep their precision.

        Raises:
            ValueError: ``values`` hold NaN or inf.
        """
        if values.numel() == 0:
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

    def row_exponents(self, values: torch.Tensor, largest=None) -> torch.Tensor:
        """Return :meth:`exponent` of each row of the ``(r, w)`` ``values``, as int32 ``(r,)``.

        The same integers (but -125 for a row of zeros, whose zeros decode alike), computed on
        the device from the bits of each row's largest magnitude, without a read; rows must be
        finite (:func:`_fp16_exponents`). ``largest``: those magnitudes, where the caller has
        them (a pass over the rows fewer).
        """
        if values.shape[1] == 0:
            return super().row_exponents(values)
        return _fp16_exponents(values.abs().amax(dim=1) if largest is None else largest)

    def _list_exponents(self, values: torch.Tensor, lists: _Lists) -> torch.Tensor:
        """Return :meth:`exponent` of each of the joined ``lists`` (as row_exponents)."""
        if len(lists.counts) == 1 and values.numel():
            return _fp16_exponents(values.abs().amax().view(1))
        largest = torch.zeros(len(lists.counts), device=values.device)
        if values.numel():
            largest.scatter_reduce_(0, lists.numbers(), values.abs(), "amax")
        return _fp16_exponents(largest)


class Bf16Codec(CompactCodec):
    """The bf16 wire: bfloat16 values, unscaled; on the host a value that overflows raises.

    Quantizing on the host checks for it (``ValueError``), one read per quantization (a list,
    rows, or all the parts of a call); encoding does not: what a sender encodes it quantized
    first. On a GPU quantizing reads nothing back: such a value travels as inf and shows in the
    result, as a NaN or inf gradient does there at every wire.
    """

    wire = "bf16"
    _half = torch.bfloat16

    def _to_half(self, values: torch.Tensor, exponent: int) -> torch.Tensor:
        return _finite_bf16(super()._to_half(values, exponent))

    def _quantized(self, half: torch.Tensor) -> torch.Tensor:
        return _finite_bf16(half)

    def _rows_to_half(self, values: torch.Tensor, up: torch.Tensor, out=None):
        return values.to(self._half) if out is None else out.copy_(values)  # every 2^e is 1

    def _lists_to_half(self, values, exponents: torch.Tensor, lists: _Lists):
        return values.to(self._half)

    @staticmethod
    def _lists_from_half(half: torch.Tensor, exponents: torch.Tensor, lists: _Lists):
        return half.float()


def _finite_bf16(half: torch.Tensor) -> torch.Tensor:
    """Return ``half``; on the host, ``ValueError`` where a value is NaN or inf (one read).

    Elsewhere nothing is read: a read would be a wait for the device per quantization.
    """
    if half.device.type == "cpu" and half.numel() and not bool(torch.isfinite(half).all()):
        raise ValueError("wire='bf16': a message holds NaN or inf")
    return half


def _fp16_exponents(largest: torch.Tensor) -> torch.Tensor:
    """Return the fp16 exponent (int32) of lists whose largest magnitudes are ``largest``.

    For a normal largest |v| = (1 + f) 2^(b - 127), e = b - 142, plus 1 where (1 + f) 2^15 >
    65504, i.e. f's 23 bits exceed 0x7FE000: adding 0x1FFF carries exactly then; at least -125.
    """
    exponents = largest.view(torch.int32).add(0x1FFF).bitwise_right_shift_(23)
    return exponents.clamp_(min=_LOWEST_EXPONENT + 142).sub_(142)


def _message(out: torch.Tensor | None, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Return ``out`` for a message of ``numel`` ``dtype`` elements, else a new buffer.

    Raises:
        ValueError: ``out`` has another size or dtype.
    """
    if out is None:
        return torch.empty(numel, dtype=dtype, device=device)
    if out.numel() != numel or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"a message of {numel} {dtype} elements does not fit out ({out.numel()} {out.dtype})"
        )
    return out


def _segments(span: int) -> int:
    """Return the 65,536-wide segments of columns in ``[0, span)``; 0 where 16 bits hold them."""
    return 0 if span <= _SEGMENT else -(-span // _SEGMENT)


def _row_powers(exponents: torch.Tensor) -> torch.Tensor:
    """Return 2^e of each row's exponent as a ``(r, 1)`` column (:func:`_powers_of_two`)."""
    return _powers_of_two(exponents).unsqueeze(1)


def _powers_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """Return 2^e (float32, exact) of int32 ``exponents``, e in [-126, 127].

    Built from the bits, three operations. Values go into 16 bits divided by 2^e: the bits
    multiplying by 2^-e gave (both are the one rounding of the same exact value), with one
    power of two made instead of two.
    """
    return (exponents + 127).bitwise_left_shift_(23).view(torch.float32)


class _Lists:
    """Lists of sizes ``counts`` one after another on ``device``.

    Each entry's list number is made once, when first needed (one copy of the sizes and one
    sized ``repeat_interleave``), and serves every per-list value of a call: no read.
    """

    def __init__(self, counts: Sequence[int], device: torch.device) -> None:
        self.counts, self.device = list(counts), device
        self.total = sum(self.counts)
        self._numbers = None

    def numbers(self) -> torch.Tensor:
        """Return each entry's list number (int64)."""
        if self._numbers is None:
            sizes = device_tensor(self.counts, torch.int64, self.device)
            self._numbers = torch.repeat_interleave(sizes, output_size=self.total)
        return self._numbers

    def spread(self, per_list: torch.Tensor) -> torch.Tensor:
        """Return each list's ``per_list`` value over its entries."""
        if len(self.counts) == 1:
            return per_list.expand(self.total)
        return per_list.index_select(0, self.numbers())


def _offsets_form(span: int | None, lists: int, total: int) -> bool:
    """Whether ``lists`` lists of ``total`` entries in ``[0, span)`` travel as 16-bit offsets.

    Where the segment counts (4 bytes per list and segment) cost less than the 2 bytes an entry
    offsets save; never without a span. Sender and receiver decide alike from the sizes.
    """
    return span is not None and 2 * _segments(span) * lists < total


def _lists_bytes(counts: Sequence[int], span: int | None) -> int:
    """Return the bytes of lists of sizes ``counts`` after their counts (:meth:`encode`)."""
    total, lists = sum(counts), len(counts)
    if _offsets_form(span, lists, total):
        return 4 * lists * (1 + _segments(span)) + 4 * total
    return 4 * lists + 6 * total


def _one_count(size: int, span: int | None) -> int:
    """Return the entries of a one-list message of ``size`` bytes.

    At most one of the two forms fits a size (their rule is a threshold on the count).

    Raises:
        RuntimeError: no list has that size.
    """
    if span is not None:
        count, rest = divmod(size - 4 * (2 + _segments(span)), 4)
        if count >= 0 and not rest and _offsets_form(span, 1, count):
            return count
    count, rest = divmod(size - 8, 6)
    if count >= 0 and not rest and not _offsets_form(span, 1, count):
        return count
    raise RuntimeError(f"malformed message: {size} bytes fit no list")


def _int32_bytes(words: Sequence[int], device: torch.device) -> torch.Tensor:
    """Return host integers as the bytes of int32 words on ``device``."""
    return device_tensor(words, torch.int32, device).view(torch.uint8)


def device_tensor(values: Sequence[int], dtype: torch.dtype, device: torch.device):
    """Return host integers as a tensor on ``device``, without waiting for it.

    On a GPU the copy starts from pinned memory (PyTorch's caching host allocator keeps the
    block until the copy is done): a plain copy from pageable memory synchronizes the stream.
    """
    host = torch.tensor(list(values), dtype=dtype)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _index_bytes(indices: torch.Tensor, width: int) -> torch.Tensor:
    """Return ``indices`` as bytes: int32 (``width`` 4) or their low 16 bits (``width`` 2)."""
    if width == 4:
        return byte_view(indices.to(torch.int32))
    return byte_view((indices & 0xFFFF).to(torch.int16))


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """Return ``tensor``'s bytes, a view: what travels of a tensor of int32, float16 or bfloat16.

    A tensor of at most one entry may have stride 0 (a selection of one entry out of ties, or of
    zeros, can give one under one thread), which counts as contiguous and yet no view to
    another element size accepts; it is restrided first, the same memory and no copy.
    """
    if tensor.dim() == 1 and tensor.numel() <= 1 and tensor.stride(0) != 1:
        tensor = tensor.as_strided((tensor.numel(),), (1,))
    return tensor.view(torch.uint8)


def _segment_counts(indices: torch.Tensor, lists: _Lists, segments: int) -> torch.Tensor:
    """Return per list how many of its indices lie in each 65,536-wide segment, as bytes.

    ``(lists, segments)`` int32 counts of the joined ascending lists: by
    :func:`_searched_counts` on the CPU where the lists average 1,024 entries or more (its
    operations per list cost less than the scatter's few ns an entry), else by
    :func:`_scattered_counts`. The choice follows from the sizes alone.
    """
    if not segments or not indices.numel():
        table = torch.zeros(len(lists.counts) * segments, dtype=torch.int32, device=indices.device)
        return table.view(torch.uint8)
    searching = indices.device.type == "cpu" and indices.numel() >= 1024 * len(lists.counts)
    count = _searched_counts if searching else _scattered_counts
    return count(indices, lists, segments).view(torch.uint8).view(-1)


def _scattered_counts(indices: torch.Tensor, lists: _Lists, segments: int) -> torch.Tensor:
    """The ``(lists, segments)`` int32 counts by one ``scatter_add`` of every entry.

    One int64 place per entry, computed in place; the ones added are one value, expanded.
    """
    device = indices.device
    place = torch.empty(indices.shape, dtype=torch.int64, device=device)
    torch.bitwise_right_shift(indices, 16, out=place)
    if len(lists.counts) > 1:
        place.add_(lists.numbers(), alpha=segments)
    table = torch.zeros(len(lists.counts) * segments, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.int32, device=device).expand(place.shape)
    return table.scatter_add_(0, place, ones)


def _searched_counts(indices: torch.Tensor, lists: _Lists, segments: int) -> torch.Tensor:
    """The ``(lists, segments)`` int32 counts by a binary search of each list for the edges.

    One ``searchsorted`` of S + 1 values per list, instead of a ``scatter_add`` of every entry
    into a small table, which runs at a few ns an entry on the CPU.
    """
    edges = _segment_edges(segments, indices.dtype, indices.device)
    found = [torch.searchsorted(part, edges) for part in indices.split(lists.counts)]
    return torch.stack(found).diff(dim=1).to(torch.int32)


@functools.lru_cache(maxsize=64)
def _segment_edges(
    segments: int, dtype: torch.dtype, device: torch.device, rows: int = 0
) -> torch.Tensor:
    """Return the first index of each of ``segments`` segments, and the end: ``(S + 1,)``.

    In ``dtype`` (the indices'), the end clamped to its largest value (above every index);
    ``rows`` > 0: that many copies, ``(rows, S + 1)``. Made once per shape: read only.
    """
    edges = torch.arange(segments + 1, dtype=torch.int64, device=device) << 16
    edges = edges.clamp_(max=torch.iinfo(dtype).max).to(dtype)
    return edges.repeat(rows, 1) if rows else edges


def _restore_high(low: torch.Tensor, counts: torch.Tensor, rows: int, segments: int, entries: int):
    """Return int32 indices from their low 16 bits and their lists' segment counts.

    ``low``: int16, lists one after another, each ascending; ``counts``: ``rows x segments``
    int32 (none where ``segments`` is 0). One ``repeat_interleave``, sized: no read.
    """
    indices = low.view(torch.uint16).to(torch.int32)  # one pass
    if segments:
        starts = torch.arange(segments, dtype=torch.int32, device=low.device) << 16
        high = torch.repeat_interleave(starts.repeat(rows), counts, output_size=entries)
        indices.add_(high)
    return indices


_KINDS = {"fp32": Fp32Codec, "fp16": Fp16Codec, "bf16": Bf16Codec}
_CODECS = {wire: Codec(wire) for wire in WIRES}


# Partitions: an owner's sparse list, its indices as a list or a bitmap (ZEN's pull) -----------

#: The forms a partition's indices travel in: a list (COO) or a bitmap over the owned indices.
COO, BITMAP = 0, 1
#: How a partition's indices may travel: the smaller form per partition, or always one.
PARTITION_INDEX = ("auto", "bitmap", "coo")
_PARTITION_HEADER = 3  # int32 words: form, count, bytes of the body
_BIT_WEIGHTS = [1 << bit for bit in range(8)]


def bitmap_words(length: int) -> int:
    """Return the int32 words of a bitmap of ``length`` bits."""
    return (length + 31) // 32


def bitmap_padded(owned: torch.Tensor) -> torch.Tensor:
    """Return ``owned`` padded with zeros to whole bitmap words: what a bitmap's bits stand for."""
    return torch.cat([owned, owned.new_zeros(32 * bitmap_words(owned.numel()) - owned.numel())])


def choose_form(list_bytes: int, bitmap_bytes: int, index: str) -> int:
    """Return the form a partition travels in, given the bytes of its two encodings.

    ``index`` is one of :data:`PARTITION_INDEX`. ``"auto"`` takes the bitmap where it is
    strictly smaller than the list, else the list: at the fp32 wire, where the list costs 2
    words an entry and the bitmap 1 word per 32 owned indices plus 1 per entry, exactly where
    ceil(|L_r| / 32) < |U_r|.
    """
    if index == "bitmap":
        return BITMAP
    if index == "coo":
        return COO
    return BITMAP if bitmap_bytes < list_bytes else COO


def pack_bits(positions: torch.Tensor, length: int) -> torch.Tensor:
    """Return the bitmap of ``length`` bits with bits ``positions`` set, as int32 words.

    Bit j is bit j % 8 of byte j // 8 of the words' bytes.
    """
    device = positions.device
    mask = torch.zeros(32 * bitmap_words(length), dtype=torch.uint8, device=device)
    mask[positions.long()] = 1
    weights = device_tensor(_BIT_WEIGHTS, torch.uint8, device)
    return mask.view(-1, 8).mul_(weights).sum(1).to(torch.uint8).view(torch.int32)


def unpack_bits(words: torch.Tensor, length: int) -> torch.Tensor:
    """Return the positions (int64, ascending) of the set bits of a :func:`pack_bits` bitmap."""
    shifts = torch.arange(8, dtype=torch.uint8, device=words.device)
    bits = (words.contiguous().view(torch.uint8).unsqueeze(1) >> shifts) & 1
    return torch.nonzero(bits.view(-1)[:length]).squeeze(1)


def _bytes(tensor: torch.Tensor) -> int:
    """Return the bytes of ``tensor``'s elements."""
    return tensor.numel() * tensor.element_size()


def _as_bytes(message: torch.Tensor) -> torch.Tensor:
    """Return a codec message (int32 or uint8) as its bytes."""
    return message.contiguous().view(torch.uint8)


class Partition(NamedTuple):
    """One owner's encoded partition: its header's fields and its body.

    ``form``: :data:`COO` or :data:`BITMAP`; ``count``: its entries; ``length``: the bytes of
    the body before padding; ``body``: int32 words, padded to whole words. ``pieces``: where
    :meth:`PartitionCodec.split` cut them with the body, the codec's messages in it (views):
    ``(list,)`` for a list, ``(bitmap, values)`` for a bitmap; None elsewhere, or where the
    header does not fit them (the decoders then cut the body).
    """

    form: int
    count: int
    length: int
    body: torch.Tensor
    pieces: tuple | None = None


class PartitionCodec:
    """The bytes of owners' partitions of a sparse vector, as ZEN pulls them.

    Owner r owns the indices L_r (int32, ascending; every rank knows them) and holds the
    entries (U_r, s), U_r a subset of L_r. Its partition travels as a header ``[form, count,
    bytes]`` and a body of int32 words, padded to whole words. A list (:data:`COO`) is the
    codec's one-list message of (U_r, s); a bitmap (:data:`BITMAP`) is ceil(|L_r| / 32) words
    over L_r (bit j set where L_r[j] is in U_r), then the codec's values of s
    (:meth:`Codec.encode_values`). A message of several partitions carries their headers
    first, then their bodies.

    Args:
        coder: the wire's codec.
        index: one of :data:`PARTITION_INDEX`: ``"auto"`` sends each partition in the form of
            fewer bytes (:func:`choose_form`), ``"bitmap"`` and ``"coo"`` always in that one.
        span: the indices lie in ``[0, span)`` (the codec's lists: ``Codec.encode``).
    """

    #: The dtype of messages of partitions.
    recv_dtype = torch.int32

    def __init__(self, coder: Codec, index: str = "auto", span: int | None = None) -> None:
        self.coder = coder
        self.index = index
        self.span = span

    def encode(self, owned: torch.Tensor, indices: torch.Tensor, values: torch.Tensor):
        """Return the :class:`Partition` of entries ``(indices, values)`` of ``owned`` L_r.

        ``indices`` ascending, all in ``owned``.
        """
        count = indices.numel()
        listed = _as_bytes(self.coder.encode([(indices, values)], False, self.span))
        bitmap_bytes = 4 * bitmap_words(owned.numel()) + self.coder.values_bytes([count])
        form = choose_form(listed.numel(), bitmap_bytes, self.index)
        if form == BITMAP:
            positions = torch.searchsorted(owned, indices.to(torch.int32))
            bitmap = pack_bits(positions, owned.numel()).view(torch.uint8)
            body = torch.cat([bitmap, _as_bytes(self.coder.encode_values([values]))])
        else:
            body = listed
        length = body.numel()
        padding = -length % 4
        if padding:
            body = torch.cat([body, body.new_zeros(padding)])
        return Partition(form, count, length, body.view(torch.int32))

    def join(self, partitions: Sequence[Partition], device: torch.device) -> torch.Tensor:
        """Return one message of ``partitions``: their headers, then their bodies."""
        header = [word for part in partitions for word in part[:_PARTITION_HEADER]]
        head = device_tensor(header, torch.int32, device)
        return torch.cat([head, *[part.body for part in partitions]])

    def split(self, message: torch.Tensor, items: int) -> list:
        """Return the ``items`` :class:`Partition` of a :meth:`join` message (one host read).

        The bodies are views made by one ``split``, their pieces (:class:`Partition`) by
        another where the codec's messages are not the bodies themselves: a fixed number of
        operations, whatever ``items`` is.

        Raises:
            RuntimeError: the message does not fit its headers.
        """
        head = _PARTITION_HEADER * items
        headers = message[:head].tolist()
        if len(headers) != head:
            raise RuntimeError(f"malformed pull message: {message.numel()} words")
        fields = [
            tuple(headers[at : at + _PARTITION_HEADER]) for at in range(0, head, _PARTITION_HEADER)
        ]
        words = [(length + 3) // 4 for _, _, length in fields]
        if min(words, default=0) < 0 or head + sum(words) != message.numel():
            raise RuntimeError(f"malformed pull message: {message.numel()} words")
        bodies = message.split([head, *words])[1:]
        pieces = self._pieces(message, head, fields, bodies)
        return [Partition(*f, body, piece) for f, body, piece in zip(fields, bodies, pieces)]

    def _cuts(self, form: int, count: int, length: int) -> list | None:
        """Return the bytes of the codec's messages in a body (:class:`Partition` ``pieces``).

        None where they are not whole elements of the codec's ``recv_dtype``.
        """
        values = self.coder.values_bytes([count])
        cuts = [length - values, values] if form == BITMAP else [length]
        unit = torch.iinfo(self.coder.recv_dtype).bits // 8
        return None if min(cuts) < 0 or any(size % unit for size in cuts) else cuts

    def _pieces(self, message: torch.Tensor, head: int, fields: list, bodies: Sequence) -> list:
        """Return each partition's ``pieces``: the body itself for an fp32 list, else one cut."""
        cuts = [self._cuts(*field) for field in fields]
        whole = [
            cut == [4 * body.numel()] and body.dtype == self.coder.recv_dtype
            for cut, body in zip(cuts, bodies)
        ]
        if all(fits or cut is None for fits, cut in zip(whole, cuts)):
            return [(body,) if fits else None for fits, body in zip(whole, bodies)]
        sizes = [4 * head]
        for cut, body in zip(cuts, bodies):
            sizes += [*cut, 4 * body.numel() - sum(cut)] if cut else [4 * body.numel()]
        cut_pieces = iter(self.coder.messages_in(message, sizes)[1:])
        pieces = []
        for cut in cuts:
            pieces.append(tuple(next(cut_pieces) for _ in cut) if cut else None)
            next(cut_pieces)  # the padding, or a body not cut
        return pieces

    def decode_lists(self, partitions: dict) -> tuple:
        """Return the entries of the :data:`COO` ``{owner: partition}``, joined in order.

        Returns ``(int32 indices, float32 values)``, decoded together.

        Raises:
            RuntimeError: a partition does not fit its header.
        """
        messages = [
            p.pieces[0]
            if p.pieces and len(p.pieces) == 1
            else self.coder.message_at(p.body, 0, p.length)
            for p in partitions.values()
        ]
        indices, values, _ = self.coder.decode_joined(messages, self.span)
        if indices.numel() != sum(p.count for p in partitions.values()):
            raise RuntimeError(f"malformed partitions of owners {list(partitions)}")
        return indices, values

    def decode_bitmaps(self, partitions: dict, sizes: Sequence[int], padded: torch.Tensor):
        """Return the entries of the :data:`BITMAP` ``{owner: partition}``, joined in order.

        ``sizes``: each owner's |L_r|; ``padded``: their L_r joined, each padded to whole words
        (:func:`bitmap_padded`). Returns ``(indices, float32 values)``, the indices of
        ``padded``'s dtype; one read of the set bits for all.

        Raises:
            RuntimeError: a partition does not fit its header.
        """
        parts = list(partitions.values())
        widths = [4 * bitmap_words(size) for size in sizes]  # the bitmaps' bytes
        cut = [self._bitmap_and_values(part, width) for part, width in zip(parts, widths)]
        bitmaps = torch.cat([bitmap for bitmap, _ in cut])
        indices = padded.index_select(0, unpack_bits(bitmaps, 8 * _bytes(bitmaps)))
        counts = [part.count for part in parts]
        if indices.numel() != sum(counts):
            raise RuntimeError(f"malformed partitions of owners {list(partitions)}")
        return indices, self.coder.decode_values_joined([values for _, values in cut], counts)

    def _bitmap_and_values(self, part: Partition, width: int) -> tuple:
        """Return a bitmap partition's bitmap of ``width`` bytes and its values' message.

        Its ``pieces`` where :meth:`split` cut them so, else cut from the body; views of the
        codec's ``recv_dtype``.
        """
        if part.form == BITMAP and part.pieces and _bytes(part.pieces[0]) == width:
            return part.pieces
        bitmap = part.body[: width // 4].view(self.coder.recv_dtype)
        return bitmap, self.coder.message_at(part.body, width, part.length)
