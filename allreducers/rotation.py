"""Split-and-reduce with destination rotation (Ok-Topk, and the reduce-scatter of topkdsa).

The index space is cut into m regions; region j belongs to position j. In m - 1 steps every
position sends its part of every other region straight to that region's owner: in step j
(j = 1 .. m-1) position r sends region r+j (mod m) to position r+j and receives its own region r
from position r-j. Rotating the destinations spreads the traffic so that no owner is flooded by
everyone at once; each position sends m-1 messages and receives m-1. Round table for m = 4:

    step 1: 0 -> 1, 1 -> 2, 2 -> 3, 3 -> 0
    step 2: 0 -> 2, 1 -> 3, 2 -> 0, 3 -> 1
    step 3: 0 -> 3, 1 -> 0, 2 -> 1, 3 -> 2

Position 0 sends items [1], [2], [3] (the regions) and receives item [0] (its region) from 3, 2, 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, check_members

__all__ = ["rotation_schedule"]


def rotation_schedule(position: int, members: Sequence[int]) -> list:
    """Return the m - 1 split-and-reduce steps of ``members[position]`` (items: regions)."""
    check_members(position, members)
    m = len(members)
    steps = []
    for shift in range(1, m):
        destination = (position + shift) % m
        steps.append(
            Step(
                send_to=members[destination],
                recv_from=members[(position - shift) % m],
                send_items=(destination,),
                recv_items=(position,),
            )
        )
    return steps
