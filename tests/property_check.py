"""Random cases for every registered method: invariants that must hold whatever the input.

Each case draws a method, P in 1..12, a length in 1..6,000, a density in [0.0005, 1], a gradient
distribution (zeros, constants, ties, tiny, huge, heavy tails, single spikes), a wire, one or two
torch threads and 1-4 calls, and checks on the in-process group:

* every rank gets the same bits, and the gradient passed in is left untouched;
* mass is conserved (methods with ``conserves_mass``): summed over the ranks, gradient plus
  residual before a call equals P times the result plus the residuals after it;
* at density 1 on the fp32 wire the result is the dense average;
* the same case run twice gives the same bits.

    python -m tests.property_check --cases 10000 --seed 0

prints one line per failing case and a summary, and exits 1 if any case failed.
tests/test_property.py runs 80 seeded cases in CI.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass

import torch

import compressors
from allreducers.transports import local_group

DISTRIBUTIONS = ("zeros", "constant", "ties", "tiny", "huge", "heavy", "spike")
WIRES = ("fp32", "fp16", "bf16")
#: How far a sum may stray, relative to the largest magnitude summed: float32 rounding over a few
#: thousand additions at fp32, one 16-bit rounding per received value otherwise.
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}


@dataclass(frozen=True)
class Case:
    """One random case (see the module)."""

    method: str
    workers: int
    numel: int
    density: float
    distribution: str
    wire: str
    threads: int
    calls: int
    seed: int

    def gradient(self, rank: int, call: int) -> torch.Tensor:
        """Rank ``rank``'s gradient of call ``call``."""
        generator = torch.Generator().manual_seed(self.seed * 1000 + call * 16 + rank)
        n, kind = self.numel, self.distribution
        if kind == "zeros":
            return torch.zeros(n)
        if kind == "constant":
            return torch.full((n,), 0.25 * (rank + 1))
        if kind == "ties":
            return torch.randint(-2, 3, (n,), generator=generator).float()
        if kind == "spike":
            grad = torch.zeros(n)
            grad[(rank * 7 + call) % n] = 3.0
            return grad
        normal = torch.randn(n, generator=generator)
        if kind == "tiny":
            return normal * 1e-30
        if kind == "huge":
            return normal * 1e30
        # Heavy tails; rand() can draw 0, whose power would be inf: a diverged gradient.
        return normal * torch.rand(n, generator=generator).clamp_min(2.0**-20).pow(-2.0)


def draw(rng: random.Random, seed: int) -> Case:
    """Return a random :class:`Case` drawn from ``rng``."""
    return Case(
        method=rng.choice(compressors.available()),
        workers=rng.randint(1, 12),
        numel=rng.choice([1, 2, 3, 7, 50, 257, 1000, rng.randint(1, 6000)]),
        density=rng.choice([0.0005, 0.001, 0.01, 0.05, 0.3, 1.0, rng.uniform(0.0005, 1.0)]),
        distribution=rng.choice(DISTRIBUTIONS),
        wire=rng.choice(WIRES),
        threads=rng.choice([1, 2]),
        calls=rng.randint(1, 4),
        seed=seed,
    )


def _run(case: Case) -> list | None:
    """Run ``case``; per call the ranks' (gradient, residual before, result, residual after,
    untouched); ``None`` where the method refuses the combination (``ValueError`` at create)."""

    def body(transport):
        try:
            sync = compressors.create(
                case.method, transport, numel=case.numel, density=case.density, wire=case.wire
            )
        except ValueError:
            return None
        records = []
        for call in range(case.calls):
            grad = case.gradient(transport.rank, call)
            copy, before = grad.clone(), sync.residual.clone()
            result = sync.allreduce(grad)
            records.append((copy, before, result, sync.residual.clone(), torch.equal(grad, copy)))
        return records

    previous = torch.get_num_threads()
    torch.set_num_threads(case.threads)
    try:
        ranks = local_group(case.workers, timeout=120).run(body)
    finally:
        torch.set_num_threads(previous)
    return None if any(rank is None for rank in ranks) else ranks


def check(case: Case) -> str | None:
    """Return what ``case`` breaks, or ``None`` if every invariant holds."""
    try:
        ranks = _run(case)
        again = _run(case)
    except Exception as error:  # noqa: BLE001 - a case that raises is what the check looks for
        return f"raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if ranks is None:
        return None
    conserves = compressors.resolve(case.method).conserves_mass
    for call in range(case.calls):
        results = [rank[call][2] for rank in ranks]
        if not all(rank[call][4] for rank in ranks):
            return f"call {call}: the gradient was modified"
        if not all(torch.equal(results[0], other) for other in results[1:]):
            return f"call {call}: the ranks' results differ"
        if not torch.equal(results[0], again[0][call][2]):
            return f"call {call}: a second run gave other bits"
        grads = torch.stack([rank[call][0] for rank in ranks]).double()
        before = torch.stack([rank[call][1] for rank in ranks]).double()
        after = torch.stack([rank[call][3] for rank in ranks]).double()
        scale = max(grads.abs().max().item(), before.abs().max().item(), 1e-45)
        tolerance = TOLERANCE[case.wire] * scale * case.workers
        if not torch.isfinite(results[0]).all():
            return f"call {call}: the result is not finite"
        if conserves:
            lost = (grads + before).sum(0) - case.workers * results[0].double() - after.sum(0)
            if lost.abs().max().item() > tolerance:
                return f"call {call}: mass not conserved (off by {lost.abs().max().item():.3g})"
        if case.density == 1.0 and case.wire == "fp32" and call == 0:
            dense = grads.mean(0)
            if (results[0].double() - dense).abs().max().item() > tolerance:
                return f"call {call}: density 1 is not the dense average"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300, help="how many cases (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed (default 0)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    cases = (draw(rng, args.seed + number) for number in range(args.cases))
    return report((case, check(case)) for case in cases)


def report(results) -> int:
    """Print a line per failing ``(case, problem)`` and the summary; return the exit status."""
    passed = failed = 0
    for case, problem in results:
        if problem:
            failed += 1
            print(f"FAIL {case}: {problem}", flush=True)
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
