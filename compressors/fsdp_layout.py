"""FSDP2's reduce-scatter layout of a parameter group, and its change with the world size.

FSDP2 reduces a parameter group's gradients as one flat vector: each parameter's gradient,
padded along dim 0 to a multiple of the world size P, cut into P chunks of rows, and the
vector is the P ranks' rows one after another, rank r's row holding chunk r of every parameter
in the group's order (``torch._chunk_cat``). So the vector's length, and where a parameter's
entries lie in it, depend on P: a residual of that vector resharded to P' ranks is taken back
to the parameters (:func:`unpadded`), mapped, and laid out again for P' (:func:`padded`).
Pure functions of the group's parameter shapes (:func:`group_shapes`); no communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["group_shapes", "padded_numel", "unpadded", "padded"]


def group_shapes(module, is_fsdp) -> list | None:
    """Return the shapes of the parameters FSDP2 reduces for ``module``'s group, in its order.

    FSDP2's order: the submodules no nested ``fully_shard`` owns, children before their
    parent (post-order), each one's own parameters, each parameter once; those that take a
    gradient (``requires_grad``). ``is_fsdp(m)``: whether ``m`` is a ``fully_shard`` module.
    ``None`` where a parameter has no dimension (FSDP2's layout of one is not this one).
    """
    modules, seen = [], set()

    def visit(current) -> None:
        if current is not module and is_fsdp(current):
            return  # a nested fully_shard: its parameters are its own group's
        seen.add(current)
        for child in current.children():
            if child not in seen:
                visit(child)
        modules.append(current)

    visit(module)
    shapes, taken = [], set()
    for current in modules:
        for param in current.parameters(recurse=False):
            if id(param) in taken or not param.requires_grad:
                continue
            taken.add(id(param))
            if param.dim() == 0:
                return None
            shapes.append(tuple(param.shape))
    return shapes


def _chunks(shapes: Sequence, size: int) -> list:
    """Each parameter's entries per rank: ceil(dim 0 / P) rows of the others' product."""
    return [-(-shape[0] // size) * math.prod(shape[1:]) for shape in shapes]


def padded_numel(shapes: Sequence, size: int) -> int:
    """Return the length of the group's reduce-scatter vector at world size ``size``."""
    return size * sum(_chunks(shapes, size))


def unpadded(vector: torch.Tensor, shapes: Sequence, size: int) -> torch.Tensor:
    """Return the group's parameters' entries of a vector laid out for ``size`` ranks, joined.

    In the group's order, each parameter flattened, the padding rows dropped.

    Raises:
        ValueError: the vector is not of that layout's length, or holds a non-zero entry in a
            padding row (FSDP2 pads with zeros, and no gradient or residual lands there: a
            layout other than the one recorded).
    """
    if vector.numel() != padded_numel(shapes, size):
        raise ValueError(
            f"a vector of {vector.numel()} entries is not the reduce-scatter layout of these "
            f"parameters on {size} ranks ({padded_numel(shapes, size)} entries)"
        )
    pieces = vector.reshape(size, -1).split(_chunks(shapes, size), dim=1)
    parts = []
    for piece, shape in zip(pieces, shapes):
        whole = piece.reshape(-1)  # rank r's chunk is rows r c .. (r + 1) c: the padded param
        numel = math.prod(shape)
        if whole[numel:].count_nonzero():
            raise ValueError(
                "a non-zero entry lies in a padding row: the vector is not of the layout "
                "recorded for these parameters"
            )
        parts.append(whole[:numel])
    return torch.cat(parts) if parts else vector.new_zeros(0)


def padded(entries: torch.Tensor, shapes: Sequence, size: int) -> torch.Tensor:
    """Return the group's joined parameter ``entries`` laid out for ``size`` ranks.

    The inverse of :func:`unpadded`: zeros in the padding rows.
    """
    chunks = _chunks(shapes, size)
    out = entries.new_zeros(size, sum(chunks))
    pieces = out.split(chunks, dim=1)
    offset = 0
    for piece, shape in zip(pieces, shapes):
        numel = math.prod(shape)
        whole = entries.new_zeros(piece.numel())
        whole[:numel] = entries[offset : offset + numel]
        piece.copy_(whole.view(size, -1))
        offset += numel
    return out.reshape(-1)
