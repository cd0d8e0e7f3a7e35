"""Random cases (tests/property_check.py): 80 seeded ones in CI; the crash they found
(Ok-Topk at a 16-bit wire under one thread, zero gradients) stays covered by name."""

import random

import pytest

from tests.property_check import Case, check, draw


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_seeded_random_cases_keep_every_invariant():
    rng = random.Random(0)
    problems = [(case, check(case)) for case in (draw(rng, seed) for seed in range(80))]
    assert [pair for pair in problems if pair[1]] == []


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
@pytest.mark.parametrize("workers, numel", [(2, 2), (4, 1000), (11, 50)])
def test_oktopk_at_a_16_bit_wire_on_zero_gradients_under_one_thread(wire, workers, numel):
    case = Case("oktopk", workers, numel, 0.01, "zeros", wire, threads=1, calls=3, seed=1)
    assert check(case) is None
