"""Recursive-halving pair exchanges (R-SAG's schedule; groups of a power-of-two size).

SparDL's step 4 with R-SAG (docs/DESIGN.md, section "Step 4: Spar-All-Gather over d teams")
runs this schedule among the d holders of a block.

With m = 2^L positions, in step s = 0 .. L-1 position p exchanges with p XOR 2^(L-1-s): the pairs
are at distance m/2 first, then m/4, ..., 1. Before step s a position speaks for the 2^s
positions that agree with it on the low L-s bits (its group); the exchange merges two groups,
so after the last step everyone speaks for all m. Items are those positions, in ascending order.
Round table for m = 8:

    step 0 (distance 4): 0-4, 1-5, 2-6, 3-7
    step 1 (distance 2): 0-2, 1-3, 4-6, 5-7
    step 2 (distance 1): 0-1, 2-3, 4-5, 6-7

Position 0 sends items [0], [0, 4], [0, 2, 4, 6] and receives [4], [2, 6], [1, 3, 5, 7].
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, ceil_log2, check_members

__all__ = ["recursive_halving_schedule"]


def _group(position: int, low_bits: int, m: int) -> tuple:
    """Return the positions of ``0 .. m-1`` that agree with ``position`` on its low bits."""
    mask = (1 << low_bits) - 1
    return tuple(q for q in range(m) if q & mask == position & mask)


def recursive_halving_schedule(position: int, members: Sequence[int]) -> list:
    """Return the log2(m) pair exchanges of ``members[position]`` (the module docstring).

    Raises:
        ValueError: ``len(members)`` is not a power of two, or ``position`` is out of range.
    """
    check_members(position, members)
    m = len(members)
    if m & (m - 1):
        raise ValueError(f"recursive halving needs a power-of-two group, got {m}")
    levels = ceil_log2(m)
    steps = []
    for s in range(levels):
        partner = position ^ (1 << (levels - 1 - s))
        steps.append(
            Step(
                send_to=members[partner],
                recv_from=members[partner],
                send_items=_group(position, levels - s, m),
                recv_items=_group(partner, levels - s, m),
            )
        )
    return steps
