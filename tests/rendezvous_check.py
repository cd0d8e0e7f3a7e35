"""Every method's schedule under NCCL's point-to-point rules, modelled in process, checked.

``local_group(P, ordered=True)``: a send completes only once its receive is posted, and a rank's
operations with one peer run in order unless posted as one round. For one method, wire and P,
three calls on such a group must give the bits of three calls on the buffered group; a
schedule that relied on buffering or on the order of two operations with one peer fails with a
``TimeoutError`` instead.

    python -m tests.rendezvous_check          # every method x wire x P in 1..16

prints a line per failure and a summary; tests/test_rendezvous.py runs a sample in CI.
"""

from __future__ import annotations

import itertools
import sys

import torch

import compressors
from allreducers import WIRES
from allreducers.transports import local_group
from tests.property_check import report

NUMEL = 301


def _calls(transport, method, wire):
    sync = compressors.create(method, transport, numel=NUMEL, density=0.05, wire=wire)
    draws = torch.Generator().manual_seed(transport.rank)
    return [sync.allreduce(torch.randn(NUMEL, generator=draws)).clone() for _ in range(3)]


def check(method: str, wire: str, workers: int, timeout: float = 60) -> str | None:
    """Return how ``method`` at ``wire`` on ``workers`` ranks fails under NCCL's rules."""
    try:
        buffered = local_group(workers).run(_calls, method, wire)
    except ValueError:  # the method refuses this world size (ZEN's P, SparDL's teams)
        return None
    try:
        ordered = local_group(workers, timeout=timeout, ordered=True).run(_calls, method, wire)
    except TimeoutError as error:
        return str(error)
    for rank, (mine, theirs) in enumerate(zip(ordered, buffered)):
        if not all(torch.equal(a, b) for a, b in zip(mine, theirs)):
            return f"rank {rank}: other bits than in the buffered mode"
    return None


def main() -> int:
    grid = itertools.product(compressors.available(), WIRES, range(1, 17))
    return report(
        (f"{method} {wire} P={workers}", check(method, wire, workers))
        for method, wire, workers in grid
    )


if __name__ == "__main__":
    sys.exit(main())
