"""Spar-Reduce-Scatter (SRS) schedules for any number of workers m: SparDL's step 2.

The round table, an example and why both executions give the same bits are in docs/DESIGN.md,
section "Step 2: Spar-Reduce-Scatter for any worker count". Items are block numbers 0..m-1;
block b ends reduced on ``members[b]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, ceil_log2, check_members, cyclic

__all__ = ["srs_round_shapes", "srs_schedule", "srs_block_schedule"]


def srs_round_shapes(m: int) -> list:
    """Return (distance, blocks per message) of every SRS round for ``m`` workers.

    Round 0 has distance 2^(R-1) and carries m - 2^(R-1) blocks; round i > 0 has distance and
    block count 2^(R-1-i), for R = ceil(log2 m).
    """
    rounds = ceil_log2(m)
    shapes = []
    for i in range(rounds):
        distance = 2 ** (rounds - 1 - i)
        shapes.append((distance, m - distance if i == 0 else distance))
    return shapes


def srs_schedule(position: int, members: Sequence[int]) -> list:
    """Return the SRS steps of the worker at ``position`` among ``members``, one per round.

    In a round of (distance g, s blocks) worker r sends blocks r+g .. r+g+s-1 (mod m) to worker
    r+g in one message and receives blocks r .. r+s-1 from worker r-g.

    Args:
        position: r, this worker's index in ``members``.
        members: the group's global ranks.
    """
    check_members(position, members)
    m = len(members)
    steps = []
    for distance, count in srs_round_shapes(m):
        steps.append(
            Step(
                send_to=members[(position + distance) % m],
                recv_from=members[(position - distance) % m],
                send_items=cyclic(position + distance, count, m),
                recv_items=cyclic(position, count, m),
            )
        )
    return steps


def srs_block_schedule(position: int, members: Sequence[int]) -> list:
    """Return :func:`srs_schedule`'s steps with every round split into one step per block.

    m-1 steps, each a message of one block and a wait for the block coming in: the execution of
    the authors' released code.
    """
    return [
        Step(
            send_to=step.send_to,
            recv_from=step.recv_from,
            send_items=(sent,),
            recv_items=(received,),
        )
        for step in srs_schedule(position, members)
        for sent, received in zip(step.send_items, step.recv_items)
    ]
