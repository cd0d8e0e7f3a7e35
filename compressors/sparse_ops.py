"""Small vectorized helpers the methods share: mask positions, sparse writes, budgets, sums.

Index tensors are sorted ascending wherever a helper says so; nothing here loops over elements.
On the CPU several helpers use NumPy, which measured faster than torch on one thread
(docs/PERFORMANCE.md, section "Library internals").
"""

from __future__ import annotations

import ctypes
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from allreducers import index_add_in_order

__all__ = [
    "as_numpy",
    "flat_nonzero",
    "count_nonzero",
    "put_",
    "put_where",
    "budget",
    "equal_cuts",
    "zero_",
    "entries_at_least",
    "search_sorted",
    "is_member",
    "scatter_average_joined",
    "scatter_average_in_order",
    "union_of_rows",
    "first_of_runs",
    "top_of_union",
]


def as_numpy(array) -> np.ndarray:
    """Return the NumPy view of a CPU tensor (detached, one operation), or ``array`` itself.

    The view shares the tensor's memory: writes through it reach the tensor.
    """
    return array if isinstance(array, np.ndarray) else array.numpy(force=True)


def _on_device(array) -> bool:
    """Whether ``array`` is a tensor outside the CPU (not a NumPy array, not a CPU tensor)."""
    return isinstance(array, torch.Tensor) and array.device.type != "cpu"


def flat_nonzero(mask):
    """Return the positions (int64, ascending) of the true entries of the 1-D boolean ``mask``.

    On the CPU by NumPy's ``flatnonzero``, whose result shares its memory with the tensor. A
    NumPy ``mask`` gives a NumPy array.
    """
    if _on_device(mask):
        return torch.nonzero(mask).squeeze(1)
    if isinstance(mask, np.ndarray):
        return np.flatnonzero(mask)
    return torch.from_numpy(np.flatnonzero(as_numpy(mask)))


_COUNT_CHUNK = 1 << 18  # entries per mask of count_nonzero: 256 KB, which stays in L2


def count_nonzero(tensor: torch.Tensor) -> int:
    """Return the number of entries of ``tensor`` that are not zero (NaN counts, -0.0 does not).

    On the CPU NumPy compares and counts chunk by chunk into one small mask, which stays in the
    cache, instead of allocating a mask of n bytes per call.
    """
    if tensor.device.type != "cpu":
        return int(torch.count_nonzero(tensor))
    flat = tensor.detach().numpy().reshape(-1)
    mask = np.empty(min(flat.size, _COUNT_CHUNK), dtype=bool)
    total = 0
    for start in range(0, flat.size, _COUNT_CHUNK):
        part = flat[start : start + _COUNT_CHUNK]
        total += np.count_nonzero(np.not_equal(part, 0, out=mask[: part.size]))
    return int(total)


def put_(tensor, indices, values):
    """Set ``tensor`` at ``indices`` along its last dimension to ``values``, in place.

    As ``tensor.scatter_(-1, indices, values)`` does; on the CPU by NumPy's
    ``put_along_axis`` (CPU tensors and NumPy arrays alike).

    Args:
        tensor: the tensor (or NumPy array) to write into.
        indices: int64, distinct within a row.
        values: a tensor (or array) shaped like ``indices``, or a number.

    Returns:
        ``tensor``.
    """
    if _on_device(tensor):
        return tensor.scatter_(-1, indices, values)
    np.put_along_axis(
        as_numpy(tensor),
        as_numpy(indices),
        values if isinstance(values, numbers.Number) else as_numpy(values),
        axis=-1,
    )
    return tensor


def put_where(tensor: torch.Tensor, indices: torch.Tensor, where: torch.Tensor, values) -> None:
    """Set the 1-D ``tensor`` at ``indices[where]`` to ``values[where]``; the others keep theirs.

    Without boolean indexing (whose size is a read from a GPU): every index is written, the
    ones not ``where`` with their own value again. ``indices`` int64 and distinct; ``values`` a
    tensor like ``indices`` or a number.
    """
    put_(tensor, indices, torch.where(where, values, tensor[indices]))


def budget(numel: int, density: float) -> int:
    """Return the selection budget k = max(1, int(n * density)), never more than n."""
    return min(numel, max(1, int(numel * density)))


def equal_cuts(numel: int, parts: int) -> list:
    """Return the boundaries ``[0, c_1, ..., n]`` of ``parts`` regions of (almost) equal size."""
    return [part * numel // parts for part in range(parts + 1)]


def zero_(tensor: torch.Tensor) -> torch.Tensor:
    """Set ``tensor`` to zeros in place and return it.

    A contiguous CPU tensor is cleared by the C library's ``memset``, which is faster than
    torch's fill on large buffers where the C library streams past the cache, and otherwise
    about as fast.
    """
    if tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.numel():
        ctypes.memset(tensor.data_ptr(), 0, tensor.numel() * tensor.element_size())
        return tensor
    return tensor.zero_()


def entries_at_least(
    indices: torch.Tensor, values: torch.Tensor, magnitudes: torch.Tensor, threshold: float
) -> tuple:
    """Return the entries of a sparse list whose ``magnitudes`` are at least ``threshold``.

    Args:
        indices: the list's indices.
        values: its values.
        magnitudes: ``|values|``.
        threshold: the least magnitude kept.

    Returns:
        ``(indices, values)`` of the kept entries, in their order.
    """
    kept = flat_nonzero(magnitudes >= threshold)
    return indices.index_select(0, kept), values.index_select(0, kept)


def search_sorted(sorted_values, query):
    """Return where each entry of ``query`` goes in the ascending 1-D ``sorted_values``.

    The leftmost position (int64), as ``torch.searchsorted`` returns it.

    On the CPU by NumPy's ``searchsorted``, 2-3x faster there than torch's on one thread; a NumPy
    ``query`` gives a NumPy array.
    """
    if _on_device(query):
        return torch.searchsorted(sorted_values, query)
    place = np.searchsorted(as_numpy(sorted_values), as_numpy(query)).astype(np.int64, copy=False)
    return place if isinstance(query, np.ndarray) else torch.from_numpy(place)


def is_member(sorted_set: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Return a boolean mask of the entries of ``query`` that occur in ``sorted_set``.

    ``sorted_set`` is ascending; each of the two holds distinct values. On the CPU a query of
    similar size goes through NumPy's merge-based ``isin`` (faster there than a binary search
    per entry); a query of a few entries takes binary searches, which do not sort the set.
    """
    if sorted_set.numel() == 0 or query.numel() == 0:
        return torch.zeros(query.numel(), dtype=torch.bool, device=query.device)
    if query.device.type == "cpu" and query.numel() * 64 >= sorted_set.numel():
        return torch.from_numpy(
            np.isin(query.numpy(), sorted_set.numpy(), assume_unique=True, kind="sort")
        )
    sorted_set = sorted_set.to(query.dtype)
    position = torch.searchsorted(sorted_set, query).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[position] == query


def scatter_average_joined(
    result: torch.Tensor,
    indices: torch.Tensor,
    values: torch.Tensor,
    sizes: Sequence[int],
    workers: int,
) -> None:
    """:func:`scatter_average_in_order` of lists given joined: ``sizes`` are their lengths."""
    index_add_in_order(result, indices, values / workers, sizes)


def scatter_average_in_order(result: torch.Tensor, lists: Sequence[tuple], workers: int) -> None:
    """Add the (indices, values) lists, each value divided by ``workers``, into ``result``.

    One list after the other (k divisions per list instead of a pass over ``result``). Each
    list must hold distinct indices: then no addition races with another even on a GPU (where
    ``index_add_`` uses atomics), and every rank adds in the same order, to the same bits.
    """
    for indices, values in lists:
        result.index_add_(0, indices, values / workers)


def union_of_rows(columns: torch.Tensor, values: torch.Tensor) -> tuple:
    """Return the union of the rows' sparse lists, at a fixed capacity, and the sums there.

    ``columns`` (each row ascending; it may end in repeats of its last entry, which count once)
    and ``values`` are ``(d, h)``. Returns the union's columns ascending, then zeros up to d h;
    the sums, then zeros; and the union's size, a 0-d tensor. No size is read from the device.

    The sums are added row by row in row order (``index_add_in_order``): the same rows in the
    same order give the same bits anywhere (a row's columns are distinct, and its repeats add
    -0.0, which changes no bit in any order).
    """
    values = torch.where(first_of_runs(columns), values, -0.0)  # repeats add nothing
    flat = columns.reshape(-1)
    ordered, order = torch.sort(flat, stable=True)
    new = torch.ones_like(ordered, dtype=torch.bool)
    torch.ne(ordered[1:], ordered[:-1], out=new[1:])
    slot = torch.cumsum(new, 0).sub_(1)  # each sorted entry's place in the union
    place = torch.empty_like(slot).scatter_(0, order, slot)  # ... each entry's, in row order
    union = torch.zeros_like(flat).scatter_(0, slot, ordered)
    sums = torch.zeros(flat.numel(), device=values.device)
    index_add_in_order(sums, place, values.reshape(-1), [columns.shape[1]] * columns.shape[0])
    return union, sums, slot[-1] + 1


def first_of_runs(columns: torch.Tensor) -> torch.Tensor:
    """Return where the entries of ``columns`` differ from the one before them in their row.

    A list (a row) ascends, but may end in repeats of its last entry: those are False.
    """
    first = torch.ones_like(columns, dtype=torch.bool)
    torch.ne(columns[..., 1:], columns[..., :-1], out=first[..., 1:])
    return first


def top_of_union(selector, sums: torch.Tensor, size: torch.Tensor, k: int, places=None):
    """Return the places in a :func:`union_of_rows` union of its top-``k`` sums, ascending.

    ``size``: the union's size (a 0-d tensor); ``places``: ``0 .. k-1`` (int64), if kept. Ties
    go towards the lower place (``selector.topk``), so on the CPU the padding after the union
    is kept only where the union has fewer than ``k`` entries; wherever it is kept (also after
    a GPU's tie among zeros) it comes last and the last entry is repeated in its stead. No
    read from the device.
    """
    places = torch.arange(k, device=sums.device) if places is None else places
    if sums.numel() <= k:
        return torch.minimum(places, size - 1)
    keep = selector.topk(sums, k)
    return keep[torch.minimum(places, (keep < size).sum() - 1)]
