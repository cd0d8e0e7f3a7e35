"""A fixed hash partition of the index space [0, n) among P owners (ZEN's push and pull).

Index i belongs to owner ``hash_owner(i, P)``: a 32-bit integer mix of i (two rounds of
xor-shift and multiply, then a final xor-shift) scaled into P equal blocks of the hash range,
``(h(i) * P) >> 32``. The map depends on i and P alone: the same on every rank, every call and
every device, and independent of n, so an n not divisible by P needs no special case. It
spreads clustered non-zero positions (a layer whose gradient is large) evenly over the owners.
Everything is exact int64 arithmetic (i < 2^31, every product < 2^60), so NumPy with the same
constants gives the same owners.

:func:`partition_lists` returns, per owner r, L_r: the indices of [0, n) that r owns in
ascending order (about n / P of them). A position j in L_r is what a bit of ZEN's bitmap
stands for; the lists are computed once per (n, P) and cached.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["MIX", "hash_indices", "hash_owner", "partition_lists"]

#: The multiplier of the mix (Mueller's 32-bit integer hash).
MIX = 0x45D9F3B
_MASK = 0xFFFFFFFF
_CHUNK = 1 << 20  # indices per step while the lists are built (bounds the temporaries)


def hash_indices(indices: torch.Tensor) -> torch.Tensor:
    """Return the 32-bit hash of each index, as int64 in [0, 2^32).

    Args:
        indices: integer tensor of indices in [0, 2^31).

    Returns:
        An int64 tensor shaped like ``indices``, on its device.
    """
    x = indices.to(torch.int64) & _MASK
    x = ((x >> 16) ^ x) * MIX & _MASK
    x = ((x >> 16) ^ x) * MIX & _MASK
    return (x >> 16) ^ x


def hash_owner(indices: torch.Tensor, parts: int) -> torch.Tensor:
    """Return the owner in [0, ``parts``) of each index: its hash scaled into equal blocks.

    Args:
        indices: integer tensor of indices in [0, 2^31).
        parts: the number of owners P, from 1 to 2^24.

    Returns:
        An int64 tensor shaped like ``indices``.

    Raises:
        ValueError: ``parts`` is out of range.
    """
    if not 1 <= parts <= 1 << 24:
        raise ValueError(f"parts must lie in [1, 2^24], got {parts}")
    return (hash_indices(indices) * parts) >> 32


@functools.lru_cache(maxsize=8)
def partition_lists(numel: int, parts: int) -> tuple:
    """Return L_0, ..., L_(P-1): the indices of [0, ``numel``) each owner owns, ascending.

    Cached per (numel, parts); the tensors are shared, so callers must not modify them.

    Args:
        numel: n, the length of the index space (below 2^31).
        parts: the number of owners P.

    Returns:
        A tuple of ``parts`` int32 CPU tensors that together hold every index once.
    """
    pieces: list = [[] for _ in range(parts)]
    for start in range(0, numel, _CHUNK):
        indices = torch.arange(start, min(numel, start + _CHUNK), dtype=torch.int64)
        owners = hash_owner(indices, parts)
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=parts).tolist()
        for owner, piece in enumerate(torch.split(indices[order], counts)):
            pieces[owner].append(piece.to(torch.int32))
    return tuple(
        torch.cat(piece) if piece else torch.empty(0, dtype=torch.int32) for piece in pieces
    )
