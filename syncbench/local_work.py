"""The simulator's local-work term.

What one rank computes in a call besides waiting on the network (selection, error-feedback
accumulation, clearing the result, scatter-adds, packing, gTop-k's merges), measured by replaying
rank 0's share of the call alone in this process.

Two models of a rank's local work (``scripts/simulate.py --local-work``):

- ``select`` (the default): selection only, priced by a fixed or measured selection rate
  (:class:`syncbench.selection_cost.SelectionCost`); the same on every machine with a fixed rate.
- ``replay``: each recorded call of a method is recorded again on P in-process ranks at two sizes,
  the larger n (the simulated n, or ``--local-numel`` up to the model's n) and n / :data:`FRACTION`,
  and rank 0's share of it is timed alone with its messages played back (:mod:`syncbench.replay`, as
  the benchmark's ``--replay``): the median of :attr:`ReplayedLocalWork.repeats` calls after one
  untimed one, on one torch thread. The calls are weighted as the network's (the simulator's
  ``call_weights``), a line ``fixed + per_entry * n`` is fitted through the two sizes (:func:`fit`)
  and evaluated at the model's n. The simulator multiplies it by the network's ``compute_share`` and
  adds it to the network time in place of the selection term (which is part of it). It depends on
  this machine: state it with the figures.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .gradients import SyntheticGradients
from .replay import replay_method

__all__ = [
    "MODES",
    "FRACTION",
    "LinearFit",
    "fit",
    "replay_seconds",
    "ReplayedLocalWork",
    "describe_select",
]

MODES = ("select", "replay")
# The smaller replay size is the larger over FRACTION.
FRACTION = 4


@dataclass(frozen=True)
class LinearFit:
    """``fixed`` seconds per call plus ``per_entry`` seconds per gradient entry.

    ``failed``: the points gave a negative slope (the larger size ran faster), so the line is
    only their mean: a guess, not a fit.
    """

    fixed: float
    per_entry: float
    failed: bool = False

    def seconds(self, numel: float) -> float:
        """The fitted seconds of a call on ``numel`` entries."""
        return self.fixed + self.per_entry * numel


def fit(points) -> LinearFit:
    """The least-squares line ``fixed + per_entry * n`` through ``(n, seconds)`` points.

    Exact through two of them, kept non-negative: a negative fixed part (noise) refits the line
    through the origin, a negative slope leaves the mean seconds as a fixed part, marked
    ``failed`` and said in a warning (the predictions built on it are then a flat guess). Points
    all at one n give a line through the origin.
    """
    n, seconds = (np.array(column, dtype=float) for column in zip(*points))
    if np.ptp(n) == 0:
        return LinearFit(0.0, float(seconds.mean() / n[0]))
    per_entry, fixed = np.polyfit(n, seconds, 1)
    if per_entry < 0 and -per_entry * np.ptp(n) <= 1e-6 * seconds.mean():  # flat, to rounding
        return LinearFit(float(seconds.mean()), 0.0)
    if per_entry < 0:
        warnings.warn(
            f"local-work fit failed: the larger sizes ran faster (slope {per_entry:.3g} s per "
            f"entry over {len(n)} points); using their mean, {seconds.mean():.3g} s, for every "
            "size",
            stacklevel=2,
        )
        return LinearFit(float(seconds.mean()), 0.0, failed=True)
    if fixed < 0:
        return LinearFit(0.0, float((n * seconds).sum() / (n * n).sum()))
    return LinearFit(float(fixed), float(per_entry))


def replay_seconds(
    name: str,
    options: dict,
    workers: int,
    numel: int,
    density: float,
    call: int,
    seed: int,
    repeats: int,
    group=None,
) -> float:
    """Seconds of rank 0's share of one call, replayed alone.

    The call is number ``call`` of method ``name`` on ``workers`` ranks and ``numel`` entries of the
    benchmark's synthetic gradients of ``seed``, replayed alone
    (:func:`syncbench.replay.replay_method`, recorded on ``group``): the median of ``repeats`` timed
    calls after an untimed one, on one torch thread.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        source = SyntheticGradients(numel, seed)
        grads = [[source.get(rank, c) for rank in range(workers)] for c in range(call + 1)]
        replayed = replay_method(name, options, grads, density, group)
        grad, out = grads[-1][0], torch.empty(numel)
        del grads  # only rank 0's last gradient is replayed
        # the exact average only feeds the record's cosine, computed after the clock stops
        times = [replayed.time(grad, grad, out)["seconds"] for _ in range(repeats + 1)]
        return statistics.median(times[1:])
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class ReplayedLocalWork:
    """``--local-work replay``.

    ``numel``, the larger replay size (``None``: the simulated n); ``repeats`` timed calls per
    replay (module docstring).
    """

    numel: int | None = None
    repeats: int = 5

    def sizes(self, simulated: int, model: int, rounded) -> tuple:
        """The two replay sizes.

        The larger (``numel`` but at most the ``model``'s n, or the ``simulated`` n) and a
        :data:`FRACTION` of it, each passed through ``rounded`` (the simulator's rounding to whole
        blocks).
        """
        larger = min(self.numel, model) if self.numel else simulated
        return rounded(larger), rounded(max(1, larger // FRACTION))

    def measure(
        self,
        name: str,
        options: dict,
        workers: int,
        sizes: tuple,
        density: float,
        weights: list,
        seed: int,
        group=None,
    ) -> tuple:
        """The :func:`fit` through the replayed sizes, and its points.

        Returns ``(fit, points)``: ``points`` are ``(n, seconds)`` at each of ``sizes``, the seconds
        being the ``weights``-weighted sum over calls (``weights[c]``: call c's weight; calls of
        weight 0 are not replayed). ``group(workers)`` makes the in-process group to record on
        (``None``: ``allreducers.transports.local_group``).
        """
        points = []
        for numel in sizes:
            seconds = sum(
                weight
                * replay_seconds(
                    name,
                    options,
                    workers,
                    numel,
                    density,
                    call,
                    seed,
                    self.repeats,
                    group and group(workers),
                )
                for call, weight in enumerate(weights)
                if weight
            )
            points.append((numel, seconds))
        return fit(points), points

    def describe(self) -> str:
        """One line on the model, for the output's header."""
        larger = f"n = {self.numel:,} (at most the model's n)" if self.numel else "the simulated n"
        return (
            "local work: replayed (--local-work replay): rank 0's share of each call timed alone "
            f"in this process at {larger} and a {FRACTION}th of it, on one torch thread, fitted as "
            "fixed + per-entry seconds at the model's n and multiplied by the network's compute "
            "share; predicted = network + local work (selection included)"
        )


def describe_select() -> str:
    """The header line of ``--local-work select``."""
    return (
        "local work: selection only (--local-work select, the default): predicted = network + "
        "selection; packing, scatter-adds and copies are not modelled"
    )
