"""Binomial-tree reduce towards position 0 and broadcast from it, for any group size (gTop-k).

With p = 2^floor(log2 m) the largest power of two not above m, the e = m - p extra positions
are folded in first: position p + i sends to position i. Then a binomial tree on the first p
positions: at level s (distance d = 2^s) position r with r mod 2d == d sends to r - d, and
position r with r mod 2d == 0 receives from r + d and merges. After the reduce, position 0 has
merged every position's contribution exactly once. The broadcast plays the same steps backwards
(tree levels from the top, then the unfold p + i <- i). Every position takes part in every step,
idle or not, so all count the same rounds: ceil(log2 m) for the reduce, as many for the broadcast.

Items label whose contributions a message carries (positions); the broadcast carries item 0, the
merged result. Round table for m = 6 (p = 4, extra positions 4 and 5):

    step        reduce (send -> receive)        broadcast (send -> receive)
    fold        4 -> 0, 5 -> 1                  level 1: 0 -> 2
    level 0     1 -> 0, 3 -> 2                  level 0: 0 -> 1, 2 -> 3
    level 1     2 -> 0                          unfold:  0 -> 4, 1 -> 5

Position 2 sends items (2, 3) at level 1 of the reduce: its own and position 3's contributions.
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, check_members

__all__ = ["binomial_reduce_schedule", "binomial_broadcast_schedule"]


def _tree_shape(m: int) -> tuple:
    """Return (p, levels): the largest power of two p <= m and log2 p."""
    levels = m.bit_length() - 1
    return 2**levels, levels


def _subtree(position: int, distance: int, p: int, m: int) -> tuple:
    """Return the positions whose contributions ``position`` holds below level ``distance``."""
    base = [position + i for i in range(distance)]
    return tuple(sorted(base + [q + p for q in base if q + p < m]))


def binomial_reduce_schedule(position: int, members: Sequence[int]) -> list:
    """Return the steps of the fold-and-binomial-tree reduce towards ``members[0]``.

    See the module docstring.
    """
    check_members(position, members)
    m = len(members)
    p, levels = _tree_shape(m)
    steps = []
    if m > p:
        if position >= p:
            steps.append(
                Step(send_to=members[position - p], recv_from=None, send_items=(position,))
            )
        elif position + p < m:
            steps.append(
                Step(send_to=None, recv_from=members[position + p], recv_items=(position + p,))
            )
        else:
            steps.append(Step(send_to=None, recv_from=None))
    for level in range(levels):
        distance = 2**level
        if position < p and position % (2 * distance) == distance:
            steps.append(
                Step(
                    send_to=members[position - distance],
                    recv_from=None,
                    send_items=_subtree(position, distance, p, m),
                )
            )
        elif position < p and position % (2 * distance) == 0:
            steps.append(
                Step(
                    send_to=None,
                    recv_from=members[position + distance],
                    recv_items=_subtree(position + distance, distance, p, m),
                )
            )
        else:
            steps.append(Step(send_to=None, recv_from=None))
    return steps


def binomial_broadcast_schedule(position: int, members: Sequence[int]) -> list:
    """Return the steps of the binomial-tree broadcast from ``members[0]``, then the unfold.

    See the module docstring.
    """
    check_members(position, members)
    m = len(members)
    p, levels = _tree_shape(m)
    steps = []
    for level in reversed(range(levels)):
        distance = 2**level
        if position < p and position % (2 * distance) == 0:
            steps.append(
                Step(send_to=members[position + distance], recv_from=None, send_items=(0,))
            )
        elif position < p and position % (2 * distance) == distance:
            steps.append(
                Step(send_to=None, recv_from=members[position - distance], recv_items=(0,))
            )
        else:
            steps.append(Step(send_to=None, recv_from=None))
    if m > p:
        if position + p < m:
            steps.append(Step(send_to=members[position + p], recv_from=None, send_items=(0,)))
        elif position >= p:
            steps.append(Step(send_to=None, recv_from=members[position - p], recv_items=(0,)))
        else:
            steps.append(Step(send_to=None, recv_from=None))
    return steps
