"""What a schedule is: a list of steps, each at most one send and one receive for this rank.

Schedules are pure functions of (this rank's position, the group's members); they return
:class:`Step` lists and never communicate, so they can be checked exhaustively without a
transport. ``items`` are labels the method gives meaning to: block numbers in Spar-Reduce-Scatter,
positions of members whose data travels in an all-gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Step", "cyclic", "ceil_log2", "check_members"]


@dataclass(frozen=True)
class Step:
    """One communication step of one rank.

    ``send_to`` / ``recv_from`` are global ranks (``None``: nothing to send / receive in this
    step, while the rest of the group may be busy); ``send_items`` / ``recv_items`` label what the
    message carries, in message order.
    """

    send_to: int | None
    recv_from: int | None
    send_items: tuple = ()
    recv_items: tuple = ()


def cyclic(start: int, count: int, modulus: int) -> tuple:
    """Return the ``count`` labels ``start, start+1, ...`` modulo ``modulus``."""
    return tuple((start + i) % modulus for i in range(count))


def ceil_log2(value: int) -> int:
    """Return the smallest ``r`` with ``2**r >= value`` (0 for 1)."""
    if value < 1:
        raise ValueError(f"ceil_log2 needs a positive integer, got {value}")
    return (value - 1).bit_length()


def check_members(position: int, members: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``position`` indexes the distinct, non-empty ``members``."""
    if not members or len(set(members)) != len(members):
        raise ValueError(f"members must be distinct ranks, got {list(members)}")
    if not 0 <= position < len(members):
        raise ValueError(f"position {position} outside a group of {len(members)}")
