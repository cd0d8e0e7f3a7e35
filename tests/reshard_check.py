"""Resharding a synchronizer's state from P to P' ranks (``compressors.reshard``), checked.

For one method, wire and (P, P'): P in-process ranks make two calls, their states are resharded
to P' ranks, and P' ranks created alike load them. The pending update sum(residual) / P (and
with momentum correction the velocity's) must be conserved within 1e-6 relative in float64,
and the next two calls must give the same bits on every rank and conserve mass.

    python -m tests.reshard_check            # every method x wire x P, P' in 1..8

prints a line per failure and a summary; tests/test_reshard.py runs a sample in CI.
"""

from __future__ import annotations

import itertools
import sys

import torch

import compressors
from allreducers.transports import local_group
from compressors.reshard import pending_update
from tests.property_check import report

NUMEL = 600


def _gradient(rank: int, call: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(97 * call + rank)
    return torch.randn(NUMEL, generator=generator) * torch.rand(NUMEL, generator=generator).pow(-1)


def _options(method: str, wire: str, momentum: bool) -> dict:
    options = {"wire": wire}
    if momentum and compressors.resolve(method).uses_residual:
        options["momentum"] = 0.9
    return options


def _states(method, workers, options):
    def body(transport):
        sync = compressors.create(method, transport, numel=NUMEL, density=0.02, **options)
        for call in range(2):
            sync.allreduce(_gradient(transport.rank, call))
        return sync.state_dict()

    return local_group(workers, timeout=120).run(body)


def _continue(method, states, options):
    def body(transport):
        sync = compressors.create(method, transport, numel=NUMEL, density=0.02, **options)
        sync.load_state_dict(states[transport.rank])
        records = []
        for call in range(2, 4):
            grad, before = _gradient(transport.rank, call), sync.residual.clone()
            # What the call synchronizes: with momentum correction u <- m u + g, not g.
            sent = grad if sync.velocity is None else sync.velocity * sync.momentum + grad
            records.append((sent, before, sync.allreduce(grad), sync.residual.clone()))
        return records

    return local_group(len(states), timeout=120).run(body)


def check(method: str, wire: str, workers: int, size: int, momentum: bool = False) -> str | None:
    """Return what resharding ``method`` at ``wire`` from ``workers`` to ``size`` breaks."""
    options = _options(method, wire, momentum)
    try:
        states = _states(method, workers, options)
    except ValueError:  # the method refuses this world size (ZEN's P, SparDL's teams)
        return None
    new = compressors.reshard(states, size)
    if len(new) != size:
        return f"{len(new)} states for {size} ranks"
    for buffer in ("residual", "velocity"):
        if buffer not in states[0]:
            continue
        before, after = pending_update(states, buffer), pending_update(new, buffer)
        scale = before.abs().max().item() or 1.0
        if (before - after).abs().max().item() > 1e-6 * scale:
            return f"the pending {buffer} moved by {(before - after).abs().max().item():.3g}"
    try:
        ranks = _continue(method, new, options)
    except ValueError as error:
        return f"the resharded state does not load or run: {error}"
    conserves = compressors.resolve(method).conserves_mass
    for call in range(2):
        results = [rank[call][2] for rank in ranks]
        if not all(torch.equal(results[0], other) for other in results[1:]):
            return f"call {call + 2}: the ranks' results differ"
        grads, before, after = (
            torch.stack([rank[call][part] for rank in ranks]).double() for part in (0, 1, 3)
        )
        lost = (grads + before).sum(0) - size * results[0].double() - after.sum(0)
        tolerance = (1e-5 if wire == "fp32" else 2e-2) * (grads.abs().max() + before.abs().max())
        if conserves and lost.abs().max() > tolerance * size:
            return f"call {call + 2}: mass not conserved (off by {lost.abs().max().item():.3g})"
    return None


def main() -> int:
    sizes = range(1, 9)
    grid = itertools.product(compressors.available(), ("fp32", "fp16", "bf16"), sizes, sizes)
    return report(
        (
            f"{method} {wire} {workers} -> {size}",
            check(method, wire, workers, size, momentum=(workers + size) % 2 == 0),
        )
        for method, wire, workers, size in grid
    )


if __name__ == "__main__":
    sys.exit(main())
