"""ZEN's partitions: an owner's sparse list, its indices as a list or a bitmap (ZEN's pull).

Owner r owns the indices L_r and sends the entries it holds of them either as the codec's
one-list message or as a bitmap over L_r with the codec's values (:class:`PartitionCodec`);
the form per partition is the smaller one (:func:`choose_form`) unless an option fixes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..device import device_tensor
from .codec import Codec

__all__ = [
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
