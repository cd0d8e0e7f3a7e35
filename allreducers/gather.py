"""The Bruck all-gather schedule, for any group size.

SparDL runs it in its steps 4 (B-SAG) and 5 (the final gather; docs/DESIGN.md, section
"SparDL"), the baselines for their all-gathers.

Items are positions in ``members``: item j is the data that ``members[j]`` contributed.

Bruck, ceil(log2 m) steps: in step s (distance 2^s) worker r sends the first
min(2^s, m - 2^s) items it holds (r, r+1, ...) to r - 2^s and receives r+2^s, ... from r + 2^s.
Each worker sends m-1 items in all. For m = 6, worker 0:

    step 0: send [0] to 5,          receive [1] from 1
    step 1: send [0, 1] to 4,       receive [2, 3] from 2
    step 2: send [0, 1] to 2,       receive [4, 5] from 4
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, ceil_log2, check_members, cyclic

__all__ = ["bruck_allgather_schedule"]


def bruck_allgather_schedule(position: int, members: Sequence[int]) -> list:
    """Return the Bruck all-gather steps of the worker at ``position`` among ``members``."""
    check_members(position, members)
    m = len(members)
    steps = []
    for s in range(ceil_log2(m)):
        distance = 2**s
        count = min(distance, m - distance)
        steps.append(
            Step(
                send_to=members[(position - distance) % m],
                recv_from=members[(position + distance) % m],
                send_items=cyclic(position, count, m),
                recv_items=cyclic(position + distance, count, m),
            )
        )
    return steps
