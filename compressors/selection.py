"""Exact top-k by magnitude and selection above a threshold: the methods' one selection module.

:class:`Selector`'s results are exact: ``k`` indices per row, those of the ``k`` largest
``|x|``, ties towards the lower index, in ascending order. NaN and inf are never dropped
silently: a selection that meets one raises ``ValueError``. A selection can add another vector
into the rows in its pass (error feedback's grad + residual). Two verbs: :meth:`Selector.select`
chooses and leaves the rows as they are; :meth:`Selector.take` chooses and zeroes what it chose.

How it selects (a sampled or remembered threshold, one candidate pass, a linear-time pick) is
explained in docs/DESIGN.md, section "Selection"; the measurements behind its choices are in
docs/PERFORMANCE.md, section "Library internals". :func:`observe` reports every selection to
tools that model what selection costs (the simulator).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Callable, NamedTuple

import numpy as np
import torch

from .sparse_ops import as_numpy, put_

__all__ = ["Selection", "observe", "Candidates", "Selector"]

_SAMPLE = (1024, 16384)  # fewest and most sample entries per row to estimate the threshold,
_SAMPLE_SHARE = 128  # ... and between them 1/128 of the row (short rows stay cheap)
_SIGMAS = 4.0  # safety margin of the estimate, in standard deviations
_CACHED_SAMPLES = 8  # sample positions kept for this many row lengths
_REMEMBERED_KEYS = 64  # keys whose thresholds are kept (the least recently used one goes)
_CHUNK = 1 << 16  # entries per step of the one-thread candidate pass (stays in a core's L2)
_CACHED_VIEWS = 16  # (rows, n) shapes whose views of the work buffers are kept
_TINY = float(np.finfo(np.float32).smallest_subnormal)  # ">= _TINY" means "non-zero"
_NOT_FINITE = "the values to select from hold NaN or inf (a diverged gradient?)"
# A remembered threshold's margin below the last k-th |x|: least, first, most.
_MARGIN = (0.03, 0.1, 0.5)


class Selection(NamedTuple):
    """One selection as :func:`observe` reports it.

    Attributes:
        kind: ``"topk"`` (a top-k scan of an ``(r, n)`` matrix, :meth:`Selector.scan`) or
            ``"threshold"`` (a pass keeping the entries at or above a threshold:
            :meth:`Selector.at_least`, :meth:`Selector.above`).
        shape: ``(r, n)``; ``(1, n)`` for a vector.
        hinted: whether every row started from a threshold remembered under a key (always
            ``False`` for a threshold pass).
    """

    kind: str
    shape: tuple
    hinted: bool


_observers: list = []  # the callables observe() made active, in every thread


@contextlib.contextmanager
def observe(observer: Callable[[Selection], None]) -> Iterator[Callable[[Selection], None]]:
    """Report every selection to ``observer`` while the ``with`` block runs.

    Every :class:`Selector`, in every thread, calls ``observer(selection)`` with a
    :class:`Selection` once per top-k scan (which ``topk``, ``topk_rows``, ``select``, ``take``
    and ``pick`` without candidates go through) and once per threshold pass, after it ran. The
    observer runs in the selecting thread (a multi-threaded caller tells its threads apart
    itself, e.g. with ``threading.local``). Selections cost one list check more while no
    observer is active.

    Yields:
        ``observer``.
    """
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


def _report(kind: str, shape, hinted: bool) -> None:
    """Tell every active observer (:func:`observe`) of one selection."""
    for observer in _observers:
        observer(Selection(kind, tuple(shape), hinted))


class Candidates(NamedTuple):
    """What :meth:`Selector.scan` found in a ``(count, n)`` matrix.

    Attributes:
        positions: the flat positions (ascending) of the entries at or above their row's
            threshold.
        values: their signed values.
        sizes: how many of them lie in each row.
        thresholds: the rows' thresholds.
        hinted: which thresholds were remembered (not estimated).
        key: the rows' ``key`` (``None``: nothing is remembered).
    """

    positions: np.ndarray
    values: np.ndarray
    sizes: np.ndarray
    thresholds: np.ndarray
    hinted: np.ndarray
    key: object = None


class _Memory(NamedTuple):
    """The last selection from the rows of one key (docs/DESIGN.md, Selection).

    Its shape, k, each row's k-th largest |x| (``levels``), each row's margin, and each row's
    slope of log(count of |x| >= t) against log(t) between its threshold and its k-th |x|
    (NaN where unknown), which carries the level to another k.
    """

    shape: tuple
    k: int
    levels: np.ndarray
    margins: np.ndarray
    slopes: np.ndarray


class Selector:
    """Exact top-k by magnitude with reused work buffers (one instance per synchronizer).

    Args:
        seed: seeds the sample positions that estimate a row's threshold.
    """

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._samples: dict = {}
        self._memory: dict = {}
        self._buffers: dict = {}  # name: (reused CPU tensor, its NumPy view)
        self._views: dict = {}  # (rows, n): the torch pass's views of the buffers

    def __getstate__(self) -> dict:
        """Leave the reused buffers out of a copy (or a pickle): their views would come apart."""
        return {**self.__dict__, "_buffers": {}, "_views": {}}

    def topk(self, x: torch.Tensor, k: int, key=None) -> torch.Tensor:
        """Return the indices of the ``k`` entries of the 1-D ``x`` with the largest ``|x|``.

        Exactly ``min(k, len(x))`` indices (int64, ascending), ties towards the lower index.
        ``key``: see :meth:`scan`.
        """
        return self._selected(x, k, None, key, take=False)[0]

    def topk_rows(self, rows: torch.Tensor, k: int, key=None) -> torch.Tensor:
        """Return the columns of the ``k`` largest ``|x|`` in every row of the ``(r, n)`` ``rows``.

        The columns are int64, of shape ``(r, min(k, n))``, each row ascending, ties towards the
        lower index. One call costs about one top-k over ``r * n`` entries. ``key``: see
        :meth:`scan`.
        """
        return self._selected(rows, k, None, key, take=False)[0]

    def select(
        self, x: torch.Tensor, k: int, addend: torch.Tensor | None = None, key=None
    ) -> tuple:
        """Add ``addend`` into ``x`` and return the top-``k`` of the sum; ``x`` keeps its values.

        Args:
            x: a 1-D vector (one list) or an ``(r, n)`` matrix (one list per row); on the CPU
                a tensor or a NumPy array (``x`` and ``addend`` alike).
            k: the entries to select per list.
            addend: added into ``x`` first, in the selection's pass (see :meth:`scan`).
            key: names the rows across calls (see :meth:`scan`).

        Returns:
            ``(columns, values)`` as :meth:`pick` returns them: columns int64, ascending; NumPy
            arrays for a NumPy ``x``.
        """
        return self._selected(x, k, addend, key, take=False)

    def take(self, x: torch.Tensor, k: int, addend: torch.Tensor | None = None, key=None) -> tuple:
        """Take the top-``k`` out of ``x``: :meth:`select`, then zero the selected entries in ``x``.

        Returns:
            ``(columns, values)`` as :meth:`select` returns them.
        """
        return self._selected(x, k, addend, key, take=True)

    def _selected(self, x, k: int, addend, key, take: bool) -> tuple:
        """:meth:`select` (or with ``take`` :meth:`take`) of a vector or a matrix.

        On the CPU the work is NumPy's on views of ``x`` and ``addend``; the results become
        tensors only at the end (for a tensor ``x``).
        """
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        columns, values = self._pick(rows, k, self.scan(rows, k, addend, key))
        if take:
            put_(rows, columns, 0.0)
        if x.ndim == 1:
            columns, values = columns[0], values[0]
        return _typed(x, columns), _typed(x, values)

    def at_least(
        self, x: torch.Tensor, threshold: float, addend: torch.Tensor | None = None
    ) -> tuple:
        """Add ``addend`` into the 1-D ``x`` and return its entries with ``|x| >= threshold``.

        The addition runs in the same pass, as in :meth:`scan`.

        Returns:
            ``(indices, values)``: the indices int64, ascending.

        Raises:
            ValueError: an entry that passes is NaN or inf.
        """
        extra = _for_the_pass(x, addend, chunked=not x.is_cuda)
        if x.is_cuda:
            chosen = self._above(x.abs(), threshold)
            found = chosen, x.index_select(0, chosen)
        else:
            positions, values, _ = self._candidates(
                as_numpy(x).reshape(1, -1), np.full(1, threshold, np.float32), extra
            )
            found = torch.from_numpy(positions), torch.from_numpy(values)
        if _observers:
            _report("threshold", (1, x.numel()), False)
        return found

    def scan(
        self, rows: torch.Tensor, k: int, addend: torch.Tensor | None = None, key=None
    ) -> Candidates | None:
        """Find each row's candidates for its top-``k`` in one pass over the ``(r, n)`` ``rows``.

        Args:
            rows: the matrix to select from.
            k: the entries :meth:`pick` will choose per row.
            addend: a flat tensor of at most ``r * n`` entries first added in place into the
                first entries of ``rows`` (contiguous), in the same pass: the candidates are
                those of the sum.
            key: hashable; names these rows, the same data call after call. :meth:`pick`
                remembers each row's k-th largest ``|x|`` under it, and the next scan of the key
                (same shape) starts from those (docs/DESIGN.md, Selection). The 64 most recently
                used keys are kept, so a new key per call grows no memory. ``None``: every
                threshold is estimated from a sample.

        Returns:
            The :class:`Candidates` for :meth:`pick`; ``None`` on a GPU or when ``k`` covers a
            row, where only the addition happens and :meth:`pick` selects from the rows.

        Raises:
            ValueError: ``k`` < 1, ``addend`` with non-contiguous ``rows``, or a candidate that
                is NaN or inf.
        """
        n = rows.shape[1]
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if addend is not None and not _contiguous(rows):
            raise ValueError("scan adds in place: rows must be contiguous")
        cuda = _is_cuda(rows)
        extra = _for_the_pass(rows, addend, chunked=not cuda and k < n)
        if cuda or k >= n:
            if _observers:
                _report("topk", rows.shape, False)
            return None
        rows = _as_contiguous(rows)
        array = as_numpy(rows)  # the one NumPy view of the rows the pass reads
        thresholds, hinted = self._remembered(key, rows.shape, k)
        if not hinted.all():
            estimate = self._estimate(rows, k, extra, array)
            thresholds = np.where(hinted, thresholds, estimate).astype(np.float32)
        positions, values, sizes = self._candidates(rows, thresholds, extra, array)
        if _observers:
            _report("topk", rows.shape, bool(hinted.all()))
        return Candidates(positions, values, sizes, thresholds, hinted, key)

    def pick(self, rows: torch.Tensor, k: int, candidates: Candidates | None = None) -> tuple:
        """Choose each row's top-``k`` by magnitude, ties towards the lower index.

        Args:
            rows: the ``(r, n)`` matrix (on the CPU a tensor or a NumPy array).
            k: the entries to choose per row.
            candidates: :meth:`scan`'s result for these unchanged rows with at least this ``k``
                (``None``: scanned now).

        Returns:
            ``(columns, values)``: columns int64 of shape ``(r, min(k, n))``, each row
            ascending, and the entries there; NumPy arrays for NumPy ``rows``.

        Raises:
            ValueError: ``k`` < 1, or a chosen entry is NaN or inf.
        """
        columns, values = self._pick(rows, k, candidates)
        return _typed(rows, columns), _typed(rows, values)

    def _pick(self, rows, k: int, candidates: Candidates | None = None) -> tuple:
        """:meth:`pick`, with NumPy results on the CPU."""
        count, n = rows.shape
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if _is_cuda(rows):
            if k >= n:  # every entry: none is dropped, but a NaN or inf is refused
                if not torch.isfinite(rows).all():
                    raise ValueError(_NOT_FINITE)
                return torch.arange(n, device=rows.device).repeat(count, 1), rows.detach().clone()
            columns = torch.topk(rows.abs(), k, dim=1, sorted=False).indices.sort(dim=1).values
            return columns, rows.gather(1, columns)
        if k >= n:  # every entry: none is dropped, but a NaN or inf is refused as a selection's is
            array = as_numpy(rows)
            if not np.isfinite(array).all():
                raise ValueError(_NOT_FINITE)
            return np.tile(np.arange(n, dtype=np.int64), (count, 1)), array.copy()
        rows = _as_contiguous(rows)
        if candidates is None:
            candidates = self.scan(rows, k)
        positions, values, sizes = candidates.positions, candidates.values, candidates.sizes
        if (sizes < k).any():  # the threshold was too high (rare), or a row has < k non-zeros
            positions, values, sizes = self._refill(rows, k, candidates, positions, values, sizes)
        keep, levels = _keep_k_per_row(np.abs(values), k, sizes)
        kept = np.flatnonzero(keep)
        chosen = values[kept].reshape(count, k)
        if candidates.key is not None:
            self._remember(candidates, rows.shape, k, levels)
        return _columns(positions[kept], count, n, k), chosen

    def _remembered(self, key, shape: tuple, k: int) -> tuple:
        """Return per row the threshold remembered under ``key`` and whether there is one.

        There is none for a row whose k-th largest ``|x|`` was zero, nor, when ``k`` changed
        (Spar-All-Gather's adaptive h), for a row whose slope is unknown; the others carry their
        level along their slope to the new ``k``.
        """
        memory = self._recall(key, shape)
        if memory is None:
            return np.zeros(shape[0], np.float32), np.zeros(shape[0], bool)
        levels = memory.levels
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # rows not hinted
            if memory.k != k:
                levels = levels * (k / memory.k) ** (1 / memory.slopes)
            # float32: float64 thresholds would make the pass convert every entry it compares.
            thresholds = (levels * (1 - memory.margins)).astype(np.float32)
        return thresholds, np.isfinite(thresholds) & (levels >= _TINY)

    def _recall(self, key, shape: tuple) -> _Memory | None:
        """Return what is remembered under ``key`` for rows of ``shape`` (``None``: nothing)."""
        memory = self._memory.get(key) if key is not None else None
        return memory if memory is not None and memory.shape == shape else None

    def _remember(self, candidates: Candidates, shape: tuple, k: int, levels: np.ndarray) -> None:
        """Keep the rows' k-th largest ``|x|`` and slope under the candidates' key.

        A remembered threshold that let fewer than ``k`` through doubles its row's margin; one
        that did not shrinks it.
        """
        memory = self._recall(candidates.key, shape)
        margins = np.full(shape[0], _MARGIN[1])
        if memory is not None:
            missed = candidates.sizes < k
            margins = np.where(
                candidates.hinted,
                np.where(missed, memory.margins * 2, memory.margins * 0.9),
                memory.margins,
            ).clip(_MARGIN[0], _MARGIN[2])
        known = (
            (candidates.sizes > k)
            & (candidates.thresholds >= _TINY)
            & (candidates.thresholds < levels)
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            slopes = np.where(
                known, np.log(candidates.sizes / k) / np.log(candidates.thresholds / levels), np.nan
            )
        self._memory.pop(candidates.key, None)  # inserted anew: the most recently used key is last
        self._memory[candidates.key] = _Memory(shape, k, levels, margins, slopes)
        if len(self._memory) > _REMEMBERED_KEYS:
            self._memory.pop(next(iter(self._memory)))

    def _refill(
        self,
        rows: torch.Tensor,
        k: int,
        candidates: Candidates,
        positions: np.ndarray,
        values: np.ndarray,
        sizes: np.ndarray,
    ) -> tuple:
        """Return the candidates again, each row with fewer than ``k`` scanned once more.

        A short row whose threshold was above zero is scanned first from its sample's estimate,
        if a remembered threshold failed and the estimate is lower, then, if still short, for
        all its non-zeros; a row with fewer than ``k`` non-zeros is completed with its
        lowest-index zeros (the ties).
        """
        count, n = rows.shape
        thresholds = candidates.thresholds
        again = (sizes < k) & (thresholds > _TINY)
        keep = np.repeat(~again, sizes)
        positions, found_values, counts = [positions[keep]], [values[keep]], sizes.copy()
        for row in np.flatnonzero(again):
            one = rows[row : row + 1]
            limits = [np.full(1, _TINY, np.float32)]
            if candidates.hinted[row]:
                estimate = self._estimate(one, k)
                if estimate[0] < thresholds[row]:
                    limits.insert(0, estimate)
            for limit in limits:
                found, at_found, _ = self._candidates(one, limit)
                if found.size >= k:
                    break
            positions.append(found + row * n)
            found_values.append(at_found)
            counts[row] = found.size
        short = np.flatnonzero(counts < k)
        if short.size:  # fewer than k non-zeros: zeros complete them, lowest index first
            heads = as_numpy(rows)[short, :k]
            zero = ~(np.abs(heads) >= _TINY)  # at least k - count of them per row
            zero &= np.cumsum(zero, axis=1) <= (k - counts[short])[:, None]
            which, column = np.nonzero(zero)  # which: the position in ``short``
            positions.append(short[which] * n + column)
            found_values.append(heads[which, column])
        positions, found_values = np.concatenate(positions), np.concatenate(found_values)
        order = np.argsort(positions, kind="stable")
        positions = positions[order]
        return positions, found_values[order], _row_sizes(positions, count, n)

    def above(self, magnitude: torch.Tensor, threshold: float) -> torch.Tensor:
        """Return the indices (ascending) of the entries of ``magnitude`` >= ``threshold``."""
        chosen = self._above(magnitude, threshold)
        if _observers:
            _report("threshold", (1, magnitude.numel()), False)
        return chosen

    def _above(self, magnitude: torch.Tensor, threshold: float) -> torch.Tensor:
        """Run :meth:`above` unobserved (also the GPU path of :meth:`at_least`)."""
        if magnitude.is_cuda:
            return torch.nonzero(magnitude >= threshold).squeeze(1)
        size = magnitude.numel()
        mask, mask_array = self._buffer("_mask", size, torch.bool)
        if _numpy_passes():
            np.greater_equal(as_numpy(magnitude), threshold, out=mask_array[:size])
        else:
            torch.ge(magnitude, threshold, out=mask[:size])
        return torch.from_numpy(np.flatnonzero(mask_array[:size]))

    def _candidates(
        self,
        rows,
        thresholds: np.ndarray,
        extra: np.ndarray | None = None,
        array: np.ndarray | None = None,
    ) -> tuple:
        """Return flat positions, values and per-row counts of the entries at their threshold.

        Entries of ``rows`` with ``|x| >=`` their row's threshold (compared as bit patterns, so
        NaN and inf always pass and raise ``ValueError``), as NumPy arrays, positions ascending.
        One thread runs the pass in cache-sized chunks, several threads whole-matrix passes.
        ``extra`` (one thread only): a flat array first added into the rows' first entries.
        ``array``: the NumPy view of ``rows`` (a tensor or a NumPy array), if made already.
        """
        count, n = rows.shape
        values = as_numpy(rows) if array is None else array
        limits = thresholds.astype(np.float32).view(np.int32)[:, None]  # compared as bit patterns
        if not _numpy_passes():
            magnitude, bits, mask, mask_array, bound, bound_array = self._pass_views(count, n)
            tensor = rows.detach() if isinstance(rows, torch.Tensor) else torch.from_numpy(values)
            torch.abs(tensor, out=magnitude)
            bound_array[:] = limits
            torch.ge(bits, bound, out=mask)
            positions = np.flatnonzero(mask_array)
            return _finite(
                positions, values.reshape(-1)[positions], _row_sizes(positions, count, n)
            )
        flat = values.reshape(-1)
        scratch = self._buffer("_magnitude", min(count * n, _CHUNK), torch.float32)[1]
        bits = self._buffer("_mask", min(count * n, _CHUNK), torch.bool)[1]
        span = max(1, _CHUNK // n)  # whole rows per step when rows are short
        positions, found_values = [], []
        for first in range(0, count, span):
            last = min(count, first + span)
            for start in range(0, n, _CHUNK):
                end = min(n, start + _CHUNK)
                low = first * n + start  # the chunk is flat[low:low + size], contiguous
                shape, size = (last - first, end - start), (last - first) * (end - start)
                if extra is not None and low < extra.size:
                    added = flat[low : min(low + size, extra.size)]
                    np.add(added, extra[low : low + added.size], out=added)
                part, mask = scratch[:size].reshape(shape), bits[:size].reshape(shape)
                np.abs(values[first:last, start:end], out=part)
                np.greater_equal(part.view(np.int32), limits[first:last], out=mask)
                found = np.flatnonzero(mask)
                found += low
                found_values.append(flat[found])
                positions.append(found)
        positions = np.concatenate(positions)
        return _finite(positions, np.concatenate(found_values), _row_sizes(positions, count, n))

    def _buffer(self, name: str, numel: int, dtype: torch.dtype) -> tuple:
        """Return the reused CPU buffer ``name`` (at least ``numel`` entries) and its NumPy view.

        Both start at the buffer's start; a larger buffer replaces a smaller one (and the torch
        pass's views of the old one are dropped).
        """
        held = self._buffers.get(name)
        if held is None or held[0].numel() < numel or held[0].dtype != dtype:
            buffer = torch.empty(numel, dtype=dtype)
            held = self._buffers[name] = (buffer, buffer.numpy())
            self._views.clear()
        return held

    def _pass_views(self, count: int, n: int) -> tuple:
        """Return the torch pass's ``(count, n)`` views and its ``(count, 1)`` limits.

        ``|x|``, its bits as int32, the mask and the mask's NumPy view; the rows' limits (int32
        bit patterns) and their NumPy view. Kept per shape (a few shapes a synchronizer), so
        that a pass makes no views.
        """
        views = self._views.get((count, n))
        if views is None:
            size = count * n
            magnitude = self._buffer("_magnitude", size, torch.float32)[0][:size].view(count, n)
            mask, mask_array = self._buffer("_mask", size, torch.bool)
            views = (magnitude, magnitude.view(torch.int32), mask[:size].view(count, n))
            bound = torch.empty((count, 1), dtype=torch.int32)
            views += (mask_array[:size], bound, bound.numpy())
            if len(self._views) >= _CACHED_VIEWS:
                self._views.clear()
            self._views[(count, n)] = views
        return views

    def _estimate(self, rows, k: int, extra=None, array: np.ndarray | None = None) -> np.ndarray:
        """Return per row a threshold that about ``k`` plus a few standard deviations exceed.

        The estimate reads the same sample positions in every row. It is at least ``_TINY``, so
        that a mostly-zero row takes all its non-zeros and no zero as candidates. ``extra``: a
        flat array still to be added into the rows' first entries (the sample sees the sums).
        ``array``: the NumPy view of ``rows``, if made already.
        """
        count, n = rows.shape
        sample = self._samples.get(n)
        if sample is None:
            generator = torch.Generator().manual_seed(self._seed + n)
            size = min(n, max(_SAMPLE[0], min(_SAMPLE[1], n // _SAMPLE_SHARE)))
            sample = torch.randint(0, n, (size,), generator=generator).sort().values.numpy()
            if len(self._samples) >= _CACHED_SAMPLES:
                self._samples.pop(next(iter(self._samples)))
            self._samples[n] = sample
        size = sample.size
        expected = k * size / n
        rank_from_top = min(size, math.ceil(expected + _SIGMAS * math.sqrt(expected) + 4))
        table = np.take(as_numpy(rows) if array is None else array, sample, axis=1)
        if extra is not None and extra.size:
            flat = sample + (np.arange(count) * n)[:, None]
            added = np.take(extra, flat, mode="clip")  # no boolean indexing: it is slow
            if flat[-1, -1] >= extra.size:  # past the end of ``extra``: nothing to add
                added[flat >= extra.size] = 0.0
            table += added
        table = np.abs(table, out=table)
        if not np.isfinite(table).all():  # NaN would also derail the exact selection below
            raise ValueError(_NOT_FINITE)
        thresholds = np.full(table.shape[0], _TINY, dtype=table.dtype)
        # Rows whose sample has too few non-zeros keep _TINY without a partition (which crawls
        # on the long runs of equal zeros).
        full = np.count_nonzero(table >= _TINY, axis=1) >= rank_from_top
        if full.any():
            thresholds[full] = np.maximum(_kth_largest(table[full], rank_from_top), _TINY)
        return thresholds


def _for_the_pass(x, addend, chunked: bool) -> np.ndarray | None:
    """Return ``addend`` as the NumPy array the chunked candidate pass adds into ``x``.

    When no such pass will run (``chunked`` false, or several threads), ``addend`` is added
    into the first entries of the contiguous ``x`` here (by NumPy for a NumPy ``x``) and
    ``None`` is returned.
    """
    if addend is None:
        return None
    if chunked and _numpy_passes():
        return as_numpy(addend)
    if isinstance(x, np.ndarray):
        part = x.reshape(-1)[: addend.size]
        np.add(part, as_numpy(addend), out=part)
        return None
    x.view(-1)[: addend.numel()].add_(addend)
    return None


def _is_cuda(rows) -> bool:
    """Whether ``rows`` is a CUDA tensor (a NumPy array is not)."""
    return isinstance(rows, torch.Tensor) and rows.is_cuda


def _contiguous(rows) -> bool:
    """Whether ``rows`` (a tensor or a NumPy array) is C-contiguous."""
    return rows.flags.c_contiguous if isinstance(rows, np.ndarray) else rows.is_contiguous()


def _as_contiguous(rows):
    """Return ``rows`` itself if it is C-contiguous, else a contiguous copy of the same type."""
    if isinstance(rows, np.ndarray):
        return np.ascontiguousarray(rows)
    return rows.contiguous()


def _typed(like, array):
    """Return a result ``array`` as the type of ``like``: NumPy for NumPy, a tensor otherwise."""
    if isinstance(array, torch.Tensor) or isinstance(like, np.ndarray):
        return array
    return torch.from_numpy(array)


def _finite(positions: np.ndarray, values: np.ndarray, sizes: np.ndarray) -> tuple:
    """Return the candidates as they are; ``ValueError`` if a value among them is NaN or inf."""
    if not np.isfinite(values).all():
        raise ValueError(_NOT_FINITE)
    return positions, values, sizes


def _numpy_passes() -> bool:
    """Return whether full CPU passes run as NumPy ufuncs: with one torch thread."""
    return torch.get_num_threads() == 1


def _row_sizes(positions: np.ndarray, count: int, n: int) -> np.ndarray:
    """Return how many of the ascending flat ``positions`` fall in each row of ``(count, n)``."""
    return np.diff(np.searchsorted(positions, np.arange(count + 1) * n))


def _kth_largest(table: np.ndarray, k: int) -> np.ndarray:
    """Return the ``k``-th largest value of every row of ``table`` (by NumPy's introselect)."""
    place = table.shape[1] - k
    return np.partition(table, place, axis=1)[:, place]


def _columns(kept: np.ndarray, count: int, n: int, k: int) -> np.ndarray:
    """Return the ``(count, k)`` columns of ``kept``, ascending flat positions, ``k`` per row."""
    table = kept.reshape(count, k)
    return table if count == 1 else table - (np.arange(count) * n)[:, None]


def _keep_k_per_row(values: np.ndarray, k: int, sizes: np.ndarray) -> tuple:
    """Return a mask keeping each group's ``k`` largest ``values``, and each group's k-th value.

    ``values`` (all >= 0) holds the groups one after another, ``sizes`` their lengths (each at
    least ``k``). Ties go towards the lower position; one linear-time selection per group, in
    NumPy (measured faster: docs/PERFORMANCE.md, Library internals).
    """
    count = sizes.size
    starts = np.cumsum(sizes) - sizes
    kth = np.array(
        [
            np.partition(values[start : start + size], size - k)[size - k]
            if size > k
            else values[start : start + size].min()  # (completed with zeros: introselect crawls)
            for start, size in zip(starts.tolist(), sizes.tolist())
        ],
        dtype=values.dtype,
    )
    bound = kth if count == 1 else np.repeat(kth, sizes)
    keep = values >= bound
    if np.count_nonzero(keep) == count * k:
        return keep, kth
    # Ties at a group's k-th value: of those, only as many as the group still needs, lowest first.
    groups = np.repeat(np.arange(count), sizes)
    larger, ties = values > bound, values == bound
    running = np.cumsum(ties)
    ties_before = np.concatenate([[0], running])[starts]
    needed = k - np.bincount(groups[larger], minlength=count)
    return larger | (ties & (running - ties_before[groups] <= needed[groups])), kth
