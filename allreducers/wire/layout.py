"""The layout of messages: the rules and byte pieces every codec builds its messages from.

Bytes of the pieces a message joins (:func:`byte_view`, :func:`index_bytes`,
:func:`int32_bytes`), lists one after another (:class:`Lists`), the 16-bit offsets form of
ascending lists (:func:`offsets_form`, :func:`segment_counts`, :func:`restore_high`), the
sizes a receiver derives from a length (:func:`lists_bytes`, :func:`one_count`) and the
pieces of a dense region (:func:`piece_rows`). Nothing here depends on a value format.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..device import device_tensor

__all__ = [
    "SEGMENT",
    "PIECE",
    "covered",
    "message_buffer",
    "segments_of",
    "Lists",
    "offsets_form",
    "lists_bytes",
    "one_count",
    "int32_bytes",
    "index_bytes",
    "byte_view",
    "segment_counts",
    "scattered_counts",
    "searched_counts",
    "segment_edges",
    "restore_high",
    "piece_count",
    "piece_rows",
]

#: The span one 16-bit offset covers.
SEGMENT = 1 << 16
#: Values per exponent of a dense region at a 16-bit wire (:meth:`Codec.encode_region`).
PIECE = 1 << 16


def covered(tensor: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Return the entries of ``tensor`` that parts of sizes ``counts`` cover: all, usually."""
    total = sum(counts)
    return tensor if total == tensor.numel() else tensor[:total]


def message_buffer(
    out: torch.Tensor | None, numel: int, dtype: torch.dtype, device
) -> torch.Tensor:
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


def segments_of(span: int) -> int:
    """Return the 65,536-wide segments of columns in ``[0, span)``; 0 where 16 bits hold them."""
    return 0 if span <= SEGMENT else -(-span // SEGMENT)


class Lists:
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


def offsets_form(span: int | None, lists: int, total: int) -> bool:
    """Whether ``lists`` lists of ``total`` entries in ``[0, span)`` travel as 16-bit offsets.

    Where the segment counts (4 bytes per list and segment) cost less than the 2 bytes an entry
    offsets save; never without a span. Sender and receiver decide alike from the sizes.
    """
    return span is not None and 2 * segments_of(span) * lists < total


def lists_bytes(counts: Sequence[int], span: int | None) -> int:
    """Return the bytes of lists of sizes ``counts`` after their counts (:meth:`Codec.encode`)."""
    total, lists = sum(counts), len(counts)
    if offsets_form(span, lists, total):
        return 4 * lists * (1 + segments_of(span)) + 4 * total
    return 4 * lists + 6 * total


def one_count(size: int, span: int | None) -> int:
    """Return the entries of a one-list message of ``size`` bytes.

    At most one of the two forms fits a size (their rule is a threshold on the count).

    Raises:
        RuntimeError: no list has that size.
    """
    if span is not None:
        count, rest = divmod(size - 4 * (2 + segments_of(span)), 4)
        if count >= 0 and not rest and offsets_form(span, 1, count):
            return count
    count, rest = divmod(size - 8, 6)
    if count >= 0 and not rest and not offsets_form(span, 1, count):
        return count
    raise RuntimeError(f"malformed message: {size} bytes fit no list")


def int32_bytes(words: Sequence[int], device: torch.device) -> torch.Tensor:
    """Return host integers as the bytes of int32 words on ``device``."""
    return device_tensor(words, torch.int32, device).view(torch.uint8)


def index_bytes(indices: torch.Tensor, width: int) -> torch.Tensor:
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


def segment_counts(indices: torch.Tensor, lists: Lists, segments: int) -> torch.Tensor:
    """Return per list how many of its indices lie in each 65,536-wide segment, as bytes.

    ``(lists, segments)`` int32 counts of the joined ascending lists: by
    :func:`searched_counts` on the CPU where the lists average 1,024 entries or more (its
    operations per list cost less than the scatter's few ns an entry), else by
    :func:`scattered_counts`. The choice follows from the sizes alone.
    """
    if not segments or not indices.numel():
        table = torch.zeros(len(lists.counts) * segments, dtype=torch.int32, device=indices.device)
        return table.view(torch.uint8)
    searching = indices.device.type == "cpu" and indices.numel() >= 1024 * len(lists.counts)
    count = searched_counts if searching else scattered_counts
    return count(indices, lists, segments).view(torch.uint8).view(-1)


def scattered_counts(indices: torch.Tensor, lists: Lists, segments: int) -> torch.Tensor:
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


def searched_counts(indices: torch.Tensor, lists: Lists, segments: int) -> torch.Tensor:
    """The ``(lists, segments)`` int32 counts by a binary search of each list for the edges.

    One ``searchsorted`` of S + 1 values per list, instead of a ``scatter_add`` of every entry
    into a small table, which runs at a few ns an entry on the CPU.
    """
    edges = segment_edges(segments, indices.dtype, indices.device)
    found = [torch.searchsorted(part, edges) for part in indices.split(lists.counts)]
    return torch.stack(found).diff(dim=1).to(torch.int32)


@functools.lru_cache(maxsize=64)
def segment_edges(
    segments: int, dtype: torch.dtype, device: torch.device, rows: int = 0
) -> torch.Tensor:
    """Return the first index of each of ``segments`` segments, and the end: ``(S + 1,)``.

    In ``dtype`` (the indices'), the end clamped to its largest value (above every index);
    ``rows`` > 0: that many copies, ``(rows, S + 1)``. Made once per shape: read only.
    """
    edges = torch.arange(segments + 1, dtype=torch.int64, device=device) << 16
    edges = edges.clamp_(max=torch.iinfo(dtype).max).to(dtype)
    return edges.repeat(rows, 1) if rows else edges


def restore_high(low: torch.Tensor, counts: torch.Tensor, rows: int, segments: int, entries: int):
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


def piece_count(size: int) -> int:
    """Return the pieces of :data:`PIECE` values (the last one shorter) of ``size`` values."""
    return -(-size // PIECE)


def piece_rows(values: torch.Tensor) -> list:
    """Return the 1-D ``values``' pieces of :data:`PIECE` as at most two 2-D views.

    The full pieces as ``(m, PIECE)`` and the last, shorter one as ``(1, r)``; none if empty.
    """
    full = values.numel() // PIECE
    rows = [values[: full * PIECE].view(full, PIECE)] if full else []
    if values.numel() > full * PIECE:
        rows.append(values[full * PIECE :].view(1, -1))
    return rows
