"""SparDL's team layouts and ``teams="auto"``'s choice of a configuration by a timed probe.

The mechanism and the measurements are in docs/DESIGN.md, section "Team layouts and
teams=auto". A *layout* maps (team, position) to a rank:

- ``"block"``: team t holds ranks t*m .. t*m+m-1 (m = P/d), position = rank % m. With ranks
  placed host by host and m = ranks per host, a team is one host's ranks.
- ``"strided"``: team t holds the ranks r with r % d == t, position = rank // d. With d = ranks
  per host, a team is the ranks of the same local index across the hosts.

The schedules are pure functions of the member lists, so both layouts run on one engine. With
d = 1 or d = P both layouts are the same.

``teams="auto"`` times every candidate (:func:`candidates`) on throwaway synchronizers
(:func:`probe`) and takes the fastest; every rank takes the same one.
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import torch

from allreducers import check_choice

__all__ = [
    "LAYOUTS",
    "AUTO",
    "PROBE_WARMUP",
    "PROBE_FINALISTS",
    "PROBE_MARGIN",
    "PROBE_CALLS",
    "PROBE_SECONDS",
    "Candidate",
    "team_count",
    "check_layout",
    "layout_differs",
    "rank_of",
    "team_groups",
    "candidates",
    "probe",
]

LAYOUTS = ("block", "strided")
#: The word that asks SparDL to choose its teams, Spar-All-Gather variant and layout itself.
AUTO = "auto"
#: Screening: per candidate this many untimed calls (buffers, selection thresholds), then one
#: timed call.
PROBE_WARMUP = 1
#: The final: the fastest few screened candidates (at most this many, each within
#: :data:`PROBE_MARGIN` of the fastest) are built again and timed this many rounds, interleaved
#: call by call; a finalist's time is the median of its rounds.
PROBE_FINALISTS = 3
PROBE_MARGIN = 2.0
PROBE_CALLS = 4
#: The probe stops starting calls once it has run this many seconds (the slowest rank's clock);
#: the candidates not screened by then are left out, the final keeps the rounds done.
PROBE_SECONDS = 30.0


class Candidate(NamedTuple):
    """One configuration ``teams="auto"`` may choose: team count, SAG variant, layout."""

    teams: int
    sag: str
    layout: str

    def options(self) -> dict:
        """The candidate as SparDL's keyword options."""
        return {"teams": self.teams, "sag": self.sag, "layout": self.layout}


def team_count(text: str):
    """A command line's team count: ``"auto"``, or the integer ``text`` writes.

    Raises:
        ValueError: ``text`` is neither.
    """
    return AUTO if text.strip() == AUTO else int(text)


def check_layout(layout) -> str:
    """Return ``layout`` if it names a team layout (:data:`LAYOUTS`).

    Raises:
        ValueError: it does not; the message names the valid ones.
    """
    return check_choice("layout", layout, LAYOUTS, "not a team layout")


def layout_differs(teams: int, workers: int) -> bool:
    """True where ``"strided"`` teams differ from ``"block"`` ones: 1 < d < P."""
    return 1 < teams < workers


def rank_of(team: int, position: int, teams: int, workers: int, layout: str) -> int:
    """The rank at ``position`` in ``team`` of ``teams`` teams over ``workers`` ranks."""
    if layout == "block":
        return team * (workers // teams) + position
    return position * teams + team


def team_groups(rank: int, teams: int, workers: int, layout: str) -> tuple:
    """``(team, position, members, holders)`` of ``rank``.

    ``members``: the ranks of its team by position (Spar-Reduce-Scatter and the final gather run
    among them); ``holders``: the ranks at its position by team (Spar-All-Gather runs among them).
    """
    size = workers // teams
    if layout == "block":
        team, position = divmod(rank, size)
    else:
        position, team = divmod(rank, teams)
    members = [rank_of(team, i, teams, workers, layout) for i in range(size)]
    holders = [rank_of(t, position, teams, workers, layout) for t in range(teams)]
    return team, position, members, holders


def candidates(workers: int) -> list:
    """Every configuration ``teams="auto"`` weighs at P = ``workers``, in a fixed order.

    d over the divisors of P; B-SAG, and R-SAG where d > 1 is a power of two; both layouts where
    they differ (:func:`layout_differs`). One team runs no Spar-All-Gather: one candidate.
    """
    found = []
    for teams in (d for d in range(1, workers + 1) if workers % d == 0):
        variants = ("bruck", "recursive") if teams > 1 and not teams & (teams - 1) else ("bruck",)
        layouts = LAYOUTS if layout_differs(teams, workers) else LAYOUTS[:1]
        found += [Candidate(teams, sag, layout) for sag in variants for layout in layouts]
    return found


class _Clock:
    """Times calls collectively: each call's slowest rank, and the probe's time so far."""

    def __init__(self, transport, device) -> None:
        self.transport, self.device = transport, device
        self.start, self.elapsed = time.perf_counter(), 0.0

    def call(self, sync, grad: torch.Tensor, out: torch.Tensor) -> float:
        """One ``sync.allreduce(grad)``; return its slowest rank's seconds (the same on all)."""
        workers, rank = self.transport.size, self.transport.rank
        self.transport.barrier()
        begin = time.perf_counter()
        sync.allreduce(grad, out=out)
        clocks = torch.zeros(2 * workers, dtype=torch.float64, device=self.device)
        clocks[rank] = time.perf_counter() - begin
        clocks[workers + rank] = time.perf_counter() - self.start
        clocks = self.transport.allreduce_sum_(clocks).cpu()  # each slot summed with zeros
        self.elapsed = float(clocks[workers:].max())
        return float(clocks[:workers].max())


def probe(transport, build, grad: torch.Tensor, choices: list, seconds: float | None = None):
    """Time ``choices`` on throwaway synchronizers; return the fastest and the record.

    A collective: every rank calls it with the same ``choices``. ``build(candidate)`` makes a
    synchronizer on ``transport``; every call is of ``grad``, and its time is its slowest
    rank's, gathered through ``transport`` (one all-reduce of 2P numbers per call), so every
    rank sees the same numbers and makes the same choice. First a screening, one candidate after
    another (:data:`PROBE_WARMUP` untimed calls and one timed); then a final among the fastest
    (:data:`PROBE_FINALISTS`, :data:`PROBE_MARGIN`): each built again, one untimed call, then
    :data:`PROBE_CALLS` rounds interleaved call by call, so that a drift of the machine's speed
    hits them alike. The finalist of the lowest median wins (the earlier candidate on a tie);
    without a final, the fastest screened one. Once ``seconds`` (default :data:`PROBE_SECONDS`)
    have passed on the slowest rank, no candidate starts its screening and the final stops after
    its current round (it runs one at least).

    Returns:
        ``(candidate, record)``: ``record["probe"]`` lists per candidate its options, ``ms``
        (its screened call; ``None``: not screened) and, for a finalist, ``final_ms`` (its
        median); ``record["probe_seconds"]`` is the probe's time.
    """
    seconds = PROBE_SECONDS if seconds is None else seconds
    clock, scratch = _Clock(transport, grad.device), torch.empty_like(grad)
    screened = []
    for choice in choices:
        if clock.elapsed >= seconds:
            screened.append(None)
            continue
        sync = build(choice)
        for _ in range(PROBE_WARMUP):
            clock.call(sync, grad, scratch)
        screened.append(clock.call(sync, grad, scratch))
        del sync
    ranked = sorted((score, index) for index, score in enumerate(screened) if score is not None)
    finalists = [i for score, i in ranked if score <= ranked[0][0] * PROBE_MARGIN]
    finalists = sorted(finalists[:PROBE_FINALISTS])
    final = {}
    if len(finalists) > 1 and clock.elapsed < seconds:
        syncs = {index: build(choices[index]) for index in finalists}
        for index in finalists:
            clock.call(syncs[index], grad, scratch)
        final = {index: [] for index in finalists}
        for round_ in range(PROBE_CALLS):
            if round_ and clock.elapsed >= seconds:
                break
            for shift in range(len(finalists)):
                index = finalists[(round_ + shift) % len(finalists)]
                final[index].append(clock.call(syncs[index], grad, scratch))
        del syncs
    scores = {index: statistics.median(times) for index, times in final.items()} or {
        index: score for score, index in ranked
    }
    chosen = choices[min((score, index) for index, score in scores.items())[1]]
    record = {
        "probe": [
            dict(
                choice.options(),
                ms=None if screened[index] is None else round(screened[index] * 1e3, 3),
                **({"final_ms": round(scores[index] * 1e3, 3)} if index in final else {}),
            )
            for index, choice in enumerate(choices)
        ],
        "probe_seconds": round(clock.elapsed, 3),
    }
    return chosen, record
