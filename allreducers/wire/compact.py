"""The 16-bit layout: uint8 messages of the fp16 and bf16 wires, written once for both.

:class:`CompactCodec` builds every message of a 16-bit wire (lists, rows, dense values,
regions; layout in docs/DESIGN.md, section "The wire"); its value format (:mod:`.formats`)
alone tells fp16 (:class:`Fp16Codec`) from bf16 (:class:`Bf16Codec`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .codec import Codec
from .formats import FORMATS, row_powers
from .layout import (
    Lists,
    byte_view,
    covered,
    index_bytes,
    int32_bytes,
    lists_bytes,
    message_buffer,
    offsets_form,
    one_count,
    piece_count,
    piece_rows,
    restore_high,
    segment_counts,
    segment_edges,
    segments_of,
)

__all__ = ["CompactCodec", "Fp16Codec", "Bf16Codec"]


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

    def quantize_parts(self, values: torch.Tensor, counts: Sequence[int], kept: int):
        """Return a copy of ``values`` with each part but ``kept`` quantized alone, without a read.

        All parts at once: a fixed number of operations, whatever their number.
        """
        return self._sent(values, list(counts), kept, self._parts_half(values, list(counts)))

    def _parts_half(self, values: torch.Tensor, counts: list, quantizing: bool = True) -> tuple:
        """Return ``(lists, exponents, half)`` of the parts ``counts`` of ``values``.

        ``half``: the 16-bit values, checked (:meth:`.HalfFormat.checked`) where ``quantizing``.
        """
        head, lists = covered(values, counts), Lists(counts, values.device)
        exponents = self.format.list_exponents(head, lists)
        half = self.format.lists_to_half(head, exponents, lists)
        return lists, exponents, self.format.checked(half) if quantizing else half

    def _sent(self, values: torch.Tensor, counts: list, kept: int, coded: tuple):
        """Return :meth:`quantize_parts`'s result from the parts' :meth:`_parts_half`."""
        lists, exponents, half = coded
        total = sum(counts)
        sent = self.format.lists_from_half(half, exponents, lists)
        if 0 <= kept < len(counts) and counts[kept]:
            start = sum(counts[:kept])
            sent[start : start + counts[kept]] = values[start : start + counts[kept]]
        if total != values.numel():
            sent = torch.cat([sent, values[total:]])  # what no part covers, as it is
        return sent

    def rows_size(self, rows: int, width: int, span: int) -> int:
        """Return the bytes of the rows' message (docs/DESIGN.md, "The wire")."""
        return 4 * rows * (1 + segments_of(span)) + 4 * rows * width

    def encode_rows(self, columns, values, span: int, exponents=None, out=None) -> torch.Tensor:
        """Return the rows' fixed-size uint8 message (docs/DESIGN.md, "The wire").

        ``[e_1..e_r | segment counts | 16-bit low columns | 16-bit values]``: the counts (of
        each row's columns per 65,536-wide segment of ``span``, r x S int32) travel only where
        ``span`` > 65,536 and let the receiver restore the high bits of the non-decreasing rows.
        """
        rows, width = values.shape
        segments = segments_of(span)
        message = message_buffer(out, self.rows_size(rows, width, span), torch.uint8, values.device)
        head = 4 * rows * (1 + segments)
        words = message[:head].view(torch.int32)
        if exponents is None:
            exponents = self.row_exponents(values)
        words[:rows] = exponents
        if segments:  # the rows ascend: a binary search of each row for the segments' edges
            edges = segment_edges(segments, columns.dtype, columns.device, rows)
            found = torch.searchsorted(columns.contiguous(), edges)
            words[rows:].view(rows, segments).copy_(found.diff(dim=1))
        entries = rows * width
        low = message[head : head + 2 * entries].view(torch.int16).view(rows, width)
        torch.bitwise_and(columns, 0xFFFF, out=low)  # the low 16 bits, no temporary
        halves = message[head + 2 * entries :].view(self.format.dtype).view(rows, width)
        self.format.rows_to_half(values, row_powers(exponents), out=halves)
        return message

    def decode_rows(self, message: torch.Tensor, rows: int, width: int, span: int) -> tuple:
        """Return the int32 columns and float32 values of an :meth:`encode_rows` message."""
        size = self.rows_size(rows, width, span)
        if message.numel() != size:
            raise RuntimeError(f"malformed message: {message.numel()} bytes, expected {size}")
        segments = segments_of(span)
        head = 4 * rows * (1 + segments)
        words = message[:head].view(torch.int32)
        entries = rows * width
        low = message[head : head + 2 * entries].view(torch.int16)
        high = words[rows:] if segments else None
        columns = restore_high(low, high, rows, segments, entries)
        halves = message[head + 2 * entries :].view(self.format.dtype).view(rows, width)
        return columns.view(rows, width), self.format.rows_from_half(
            halves, row_powers(words[:rows])
        )

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
        return torch.cat([int32_bytes(counts, device), *coded])

    def _coded(self, indices, values, counts: Sequence[int], span: int | None) -> list:
        """Return the byte pieces ``exponents | [segment counts] | indices | values`` of lists."""
        lists, exponents, half = self._parts_half(values, list(counts), quantizing=False)
        halves = byte_view(half)
        if not offsets_form(span, len(counts), sum(counts)):
            return [byte_view(exponents), index_bytes(indices, 4), halves]
        segments = segment_counts(indices, lists, segments_of(span))
        return [byte_view(exponents), segments, index_bytes(indices, 2), halves]

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
        expected = head + lists_bytes(counts, span)
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
        return self.decode(message, 1, [one_count(message.numel(), span)], span)[0]

    def _decoded(self, messages: Sequence, counts: Sequence, span: int | None) -> tuple:
        """Return the int32 indices and float32 values of ``messages``, joined.

        ``counts[i]``: message i's list sizes (its length checked). One ``cat`` of the messages
        and one ``split`` into counts, exponents, segment counts, indices and values; offsets
        restored by one ``repeat_interleave`` and values scaled on the device: no read.
        """
        forms = [offsets_form(span, len(sizes), sum(sizes)) for sizes in counts]
        segments = segments_of(span) if span is not None else 0
        cuts = []
        for sizes, offsets in zip(counts, forms):
            total = sum(sizes)
            cuts += [4 * len(sizes), 4 * len(sizes), 4 * len(sizes) * segments if offsets else 0]
            cuts += [(2 if offsets else 4) * total, 2 * total]
        pieces = (torch.cat(list(messages)) if len(messages) > 1 else messages[0]).split(cuts)
        lists = Lists([size for sizes in counts for size in sizes], pieces[0].device)
        exponents = torch.cat(pieces[1::5]).view(torch.int32)
        values = self.format.lists_from_half(
            torch.cat(pieces[4::5]).view(self.format.dtype), exponents, lists
        )
        totals = [sum(sizes) for sizes in counts]
        # Each form's indices at once (joined, so aligned), then back in the messages' order.
        decoded = {}
        for offsets in sorted(set(forms)):
            at = [body for body, form in enumerate(forms) if form == offsets]
            joined = torch.cat([pieces[3 + 5 * body] for body in at])
            if offsets:
                rows = sum(len(counts[body]) for body in at)
                high = torch.cat([pieces[2 + 5 * body] for body in at]).view(torch.int32)
                joined = restore_high(
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
        indices, halves = covered(indices, counts), byte_view(half)
        forms = [offsets_form(span, 1, count) for count in counts]
        cut = {"c": int32_bytes(counts, half.device).split(4)}
        cut["e"] = byte_view(exponents).split(4)
        cut["v"] = halves.split([2 * count for count in counts])
        if any(forms):
            segments = segments_of(span)
            table = segment_counts(indices, lists, segments)
            cut["s"] = table.split(4 * segments) if segments else [table] * len(counts)
            cut["o"] = index_bytes(indices, 2).split([2 * c for c in counts])
        if not all(forms):
            cut["i"] = index_bytes(indices, 4).split([4 * c for c in counts])
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
        counts = [one_count(message.numel(), span) for message in messages]
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
        lists = Lists(sizes, message.device)
        values = self.format.lists_from_half(
            message[head:].view(self.format.dtype), exponents, lists
        )
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
        # 2^e is exact in float32, and so is every product (e >= -125): the bits of from_half.
        lists = Lists([size for _, size in pairs], joined.device)
        return self.format.lists_from_half(
            torch.cat(cut[1::2]).view(self.format.dtype), exponents, lists
        )

    def encode_region(self, values: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Return the pieces' exponents and 16-bit values as one uint8 message, without a read.

        The pieces are at most two 2-D views (:func:`piece_rows`), each scaled by a column of
        powers of two and written straight into the message: the bits of
        :meth:`quantize_parts` and :meth:`encode_values`, with no index per entry.
        """
        rows = piece_rows(values)
        head = 4 * piece_count(values.numel())
        message = torch.empty(head + 2 * values.numel(), dtype=torch.uint8, device=values.device)
        if not rows:
            return message
        exponents = message[:head].view(torch.int32)
        exponents.copy_(torch.cat([self.row_exponents(part) for part in rows]))
        half = message[head:].view(self.format.dtype)
        counts = [part.shape[0] for part in rows]
        upper = row_powers(exponents).split(counts)  # divided by (as rows), then multiplied
        for part, half_part, scale in zip(rows, piece_rows(half), upper):
            torch.div(part, scale, out=half_part)
        self.format.checked(half)
        if residual:
            for part, half_part, scale in zip(rows, piece_rows(half), upper):
                part.addcmul_(half_part, scale, value=-1)
        return message

    def split_regions(self, message: torch.Tensor, sizes: Sequence[int]) -> list:
        """Return each region's ``(head, body)``: views of its exponents' and values' bytes."""
        pieces = [piece_count(size) for size in sizes]
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
        rows = piece_rows(out)
        upper = row_powers(head.view(torch.int32))
        halves = piece_rows(body.view(self.format.dtype))
        for part, half_part, scale in zip(rows, halves, upper.split([p.shape[0] for p in rows])):
            if add:
                part.addcmul_(half_part, scale)
            else:
                torch.mul(half_part, scale, out=part)
        return out


class Fp16Codec(CompactCodec):
    """The fp16 wire: float16 values, scaled by a power of two per list (:class:`.Fp16Format`)."""

    wire = "fp16"
    format = FORMATS["fp16"]


class Bf16Codec(CompactCodec):
    """The bf16 wire: bfloat16 values, unscaled (:class:`.Bf16Format`)."""

    wire = "bf16"
    format = FORMATS["bf16"]
