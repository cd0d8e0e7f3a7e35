"""What selection costs in the simulator.

Which vectors each rank hands to the selector (:class:`SelectionCounter`, an observer of
``compressors.selection``) and how long a selection of a given length takes
(:class:`SelectionCost`).

The default is a fixed throughput, :data:`DEFAULT_SELECT_RATE` entries per second for every
kind of selection, so that a table is the same on every machine; measuring this machine's
selector is an option (``SelectionCost(rate=None)``).
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import torch

from compressors.selection import Selection, Selector, observe

from .gradients import SyntheticGradients

__all__ = ["DEFAULT_SELECT_RATE", "SelectionCounter", "SelectionCost"]

# Entries per second of one selection, the simulator's default: about what this project's
# selector does on one core of a current x86 server for a top-k of 14.7M entries (15 ms).
DEFAULT_SELECT_RATE = 1e9


class SelectionCounter:
    """While active (``with``), logs the selections of every thread.

    Per thread, the length of every vector handed to a top-k selection (a matrix logs its first row
    as a ``topk`` and each further row as a ``topk_row``, or as ``hinted`` and ``hinted_row`` when
    the selector started every row from a remembered threshold) and to a threshold pass (``above``),
    as :func:`compressors.selection.observe` reports them.
    """

    KINDS = ("topk", "topk_row", "hinted", "hinted_row", "above")

    def __init__(self) -> None:
        self._local = threading.local()
        self._observing = None

    def __enter__(self) -> SelectionCounter:
        self._observing = observe(self.log)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._observing.__exit__(*exc)

    def log(self, selection: Selection) -> None:
        """Log one selection in the calling thread's counts."""
        lengths = self._lengths()
        rows, n = selection.shape
        if selection.kind == "threshold":
            lengths["above"] += [n] * rows
            return
        first = "hinted" if selection.hinted else "topk"
        lengths[first].append(n)
        lengths[first + "_row"] += [n] * (rows - 1)

    def take(self) -> dict:
        """This thread's vector lengths per kind since the last ``take``."""
        lengths = self._lengths()
        self._local.lengths = {kind: [] for kind in self.KINDS}
        return lengths

    def _lengths(self) -> dict:
        if not hasattr(self._local, "lengths"):
            self._local.lengths = {kind: [] for kind in self.KINDS}
        return self._local.lengths


class SelectionCost:
    """Seconds one selection of a vector of a given length takes.

    ``rate`` (entries/s): a fixed throughput for every kind (e.g. :data:`DEFAULT_SELECT_RATE`,
    or a GPU's). ``rate=None``: measured on this machine (``device``, ``threads`` threads) at
    lengths 4^6 .. 4^12, best of ``repeats`` timings taken in turns (:func:`_time_selections`),
    each of enough calls to scan at least 2^22 entries (single short calls time mostly noise):
    ``topk`` is ``Selector.topk`` keeping density * length entries, ``above`` is
    ``Selector.at_least`` keeping about as many (the threshold pass of Ok-Topk and Gaussiank),
    ``topk_row`` is what each further row of a matrix adds to a ``Selector.topk_rows`` call
    (SparDL's cuts of several blocks at once; timed on a matrix of at least 2^23 entries, so
    that it comes from memory as the blocks do): short rows cost more per entry than one long
    vector. ``hinted`` and ``hinted_row`` are the same with a key, taking turns between two
    independent draws, so each call starts from thresholds remembered from other values, as
    from one gradient to the next. Other lengths are interpolated in log-log (constant rate
    beyond the ends).
    """

    LENGTHS = tuple(4**i for i in range(6, 13))

    def __init__(
        self,
        density: float,
        threads: int = 1,
        rate: float | None = None,
        seed: int = 0,
        repeats: int = 9,
        device: str = "cpu",
    ) -> None:
        self.lengths = np.array(self.LENGTHS, dtype=float)
        self.fixed_rate = rate
        if rate is not None:
            self.seconds_at = {kind: self.lengths / rate for kind in SelectionCounter.KINDS}
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            self.seconds_at = _time_selections(density, seed, repeats, device)
        finally:
            torch.set_num_threads(previous)

    def seconds(self, kind: str, lengths) -> float:
        """Total seconds of selections of ``kind`` on vectors of ``lengths`` (any reals >= 1)."""
        lengths = np.asarray(lengths, dtype=float)
        if lengths.size == 0:
            return 0.0
        rates = self.lengths / self.seconds_at[kind]
        rate = np.exp(np.interp(np.log(lengths), np.log(self.lengths), np.log(rates)))
        return float((lengths / rate).sum())

    def rate(self, kind: str, length: int) -> float:
        """Entries per second of one selection of ``kind`` on a vector of ``length``."""
        return length / self.seconds(kind, [length])

    def describe(self, where: str = "") -> str:
        """One line on the selection throughput this cost assumes (``where``: what measured it)."""
        if self.fixed_rate is not None:
            default = " (the default)" if self.fixed_rate == DEFAULT_SELECT_RATE else ""
            return f"selection: a fixed {self.fixed_rate / 1e6:g} M entries/s{default}"
        parts = [
            f"{kind} " + ", ".join(f"{self.rate(kind, n) / 1e6:.0f}" for n in (4**8, 4**10, 4**12))
            for kind in SelectionCounter.KINDS
        ]
        return (
            f"selection measured on {where or 'this machine'}, M entries/s at "
            f"n = 65,536 / 1,048,576 / 16,777,216: {'; '.join(parts)} (the default, for "
            "reproducible tables, is a fixed "
            f"{DEFAULT_SELECT_RATE / 1e6:g} M entries/s)"
        )


def _selection_runs(numel: int, density: float, seed: int, device: str) -> dict:
    """Per kind (see :class:`SelectionCost`), a function that runs one selection.

    The function runs on ``device``; with it comes the number of rows of length ``numel`` it selects
    from. The ``hinted`` kinds take turns between two independent draws under one key, so each
    starts from the other's thresholds.
    """
    rows = max(2, (1 << 23) // numel)
    x, other = (SyntheticGradients(numel, seed).get(0, call).to(device) for call in (0, 1))
    matrices = [
        SyntheticGradients(rows * numel, seed).get(0, call).to(device).view(rows, numel)
        for call in (0, 1)
    ]
    k = max(1, int(numel * density))
    threshold = float(x.abs().kthvalue(max(1, numel - k)).values)
    selector = Selector()
    vectors, tables = itertools.cycle((x, other)), itertools.cycle(matrices)
    return {
        "topk": (lambda: selector.topk(x, k), 1),
        "above": (lambda: selector.at_least(x, threshold), 1),
        "topk_row": (lambda: selector.topk_rows(matrices[0], k), rows),
        "hinted": (lambda: selector.topk(next(vectors), k, key="vector"), 1),
        "hinted_row": (lambda: selector.topk_rows(next(tables), k, key="matrix"), rows),
    }


def _time_selections(density: float, seed: int, repeats: int, device: str) -> dict:
    """Best seconds of one selection per kind at each of :attr:`SelectionCost.LENGTHS`.

    The repeats take turns over all kinds and lengths, so that a burst of load on the machine spoils
    one timing of many rather than every timing of one. A ``topk_row`` is the matrix call's time
    less one ``topk``, per further row.
    """
    runs = {numel: _selection_runs(numel, density, seed, device) for numel in SelectionCost.LENGTHS}
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = {kind: np.full(len(runs), np.inf) for kind in SelectionCounter.KINDS}
    for repeat in range(repeats + 1):  # the first round warms up
        for place, (numel, by_kind) in enumerate(runs.items()):
            for kind, (run, rows) in by_kind.items():
                calls = max(1, (1 << 22) // (rows * numel))
                synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                synchronize()
                if repeat:
                    best[kind][place] = min(
                        best[kind][place], (time.perf_counter() - start) / calls
                    )
    rows = np.array([by_kind["topk_row"][1] for by_kind in runs.values()])
    for single in ("topk", "hinted"):
        further = best[single + "_row"] - best[single]
        best[single + "_row"] = np.maximum(further, 0.01 * best[single]) / (
            rows - 1
        )  # > 0 even in noise
    return best
