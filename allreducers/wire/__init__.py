"""The codec seam: how sparse lists and dense values travel (docs/DESIGN.md, section "The wire").

``codec(wire)`` returns the :class:`Codec` of a wire format: ``"fp32"`` (int32 indices, float32
values, the original layout, bit for bit), ``"fp16"`` or ``"bf16"`` (16-bit values, indices as
16-bit offsets where they fit). The package holds the wire on two axes:

- :mod:`.formats`: the value formats (fp32, fp16, bf16): the dtype values travel in, their
  exponents, their scaling and what quantizing checks, each written once;
- :mod:`.layout`: the pieces and rules messages are built from (byte views, lists, offsets,
  segment counts, dense pieces), which no format changes;
- :mod:`.codec`: the :class:`Codec` contract and the fp32 word layout (:class:`Fp32Codec`);
- :mod:`.compact`: the 16-bit byte layout (:class:`CompactCodec`), one class for fp16
  (:class:`Fp16Codec`) and bf16 (:class:`Bf16Codec`), which differ in their format only;
- :mod:`.partitions`: ZEN's partitions (:class:`PartitionCodec`: an owner's indices as a list
  or as a bitmap over the indices it owns).

Methods hand ``(indices, values)`` lists to the engine; only the wire knows the bytes.
``Codec(wire)`` builds a new codec of ``wire``; :func:`codec` returns the shared one.
"""

from __future__ import annotations

from ..device import device_tensor
from .codec import KINDS, Codec, Fp32Codec
from .compact import Bf16Codec, CompactCodec, Fp16Codec
from .formats import WIRES, check_wire
from .layout import PIECE, byte_view
from .partitions import (
    BITMAP,
    COO,
    PARTITION_INDEX,
    Partition,
    PartitionCodec,
    bitmap_padded,
    bitmap_words,
    choose_form,
    pack_bits,
    unpack_bits,
)

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

_CODECS = {wire: KINDS[wire]() for wire in WIRES}


def codec(wire: str = "fp32") -> Codec:
    """Return the codec of wire format ``wire`` (one of :data:`WIRES`).

    Raises:
        ValueError: an unknown wire format.
    """
    return _CODECS[check_wire(wire)]
