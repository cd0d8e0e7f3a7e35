"""Spar-Reduce-Scatter (SRS) rounds for any number of workers m.

With R = ceil(log2 m) rounds, round 0 has distance g_0 = 2^(R-1) and carries s_0 = m - 2^(R-1)
blocks; round i > 0 has g_i = s_i = 2^(R-1-i). In round i worker r sends blocks
r+g_i .. r+g_i+s_i-1 (mod m) to worker r+g_i in one message and receives blocks r .. r+s_i-1 from
worker r-g_i. Partners are cyclic shifts, not XOR pairs, so any m works. After the last round
worker r holds block r summed over all m workers exactly once; it sent m-1 blocks in all and
never its own block. Round table (distance, blocks per message):

    m = 5: (4, 1) (2, 2) (1, 1)        m = 6: (4, 2) (2, 2) (1, 1)
    m = 7: (4, 3) (2, 2) (1, 1)        m = 8: (4, 4) (2, 2) (1, 1)

For worker 0 of m = 6 that is: send [4, 5] to 4 / receive [0, 1] from 2; send [2, 3] to 2 /
receive [0, 1] from 4; send [1] to 1 / receive [0] from 5.

:func:`srs_block_schedule` plays the same table one block per step (m-1 steps, each a message of
one block and a wait for the block coming in): the execution of the authors' released code.
A round's sent and received blocks are disjoint, and a block received in a round is sent only in
a later one, so splitting a round changes no value, only the number of messages and rounds.
For worker 0 of m = 6: send [4] to 4 / receive [0] from 2; send [5] to 4 / receive [1] from 2;
send [2] to 2 / receive [0] from 4; send [3] to 2 / receive [1] from 4; send [1] to 1 / receive
[0] from 5.
"""

from __future__ import annotations

from collections.abc import Sequence

from .schedule import Step, ceil_log2, check_members, cyclic


def srs_round_shapes(m: int) -> list:
    """(distance, blocks per message) of every SRS round for ``m`` workers."""
    rounds = ceil_log2(m)
    shapes = []
    for i in range(rounds):
        distance = 2 ** (rounds - 1 - i)
        shapes.append((distance, m - distance if i == 0 else distance))
    return shapes


def srs_schedule(position: int, members: Sequence[int]) -> list:
    """The SRS steps of the worker at ``position`` among ``members`` (global ranks).

    Items are block numbers 0..m-1; block b ends reduced on ``members[b]``.
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
    """:func:`srs_schedule` with every round split into one step per block (m-1 steps)."""
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
