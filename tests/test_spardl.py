"""SparDL on the in-process group: an exact numpy reference, invariants, accounting, options."""

import math

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.spardl import HeightAdapter
from tests.ranks import heavy_tailed, mass_error, run_calls

TEAM_CASES = [(4, 2), (6, 2), (6, 3), (8, 2), (8, 4), (9, 3), (16, 4)]


def reference_topk(row, k):
    order = np.lexsort((np.arange(len(row)), -np.abs(row)))
    return np.sort(order[:k])


def reference_srs(accumulated, k):
    """Spar-Reduce-Scatter of one team written from the paper, sequentially, in numpy
    (float32): the workers' dense copies (workers, workers, block) afterwards, block w of worker
    w summed over the team, every sent top-k taken out of its sender's copy."""
    workers, n = accumulated.shape
    block = math.ceil(n / workers)
    copies = np.zeros((workers, workers * block), np.float32)
    copies[:, :n] = accumulated
    copies = copies.reshape(workers, workers, block)
    rounds = math.ceil(math.log2(workers)) if workers > 1 else 0
    for i in range(rounds):
        distance = 2 ** (rounds - 1 - i)
        count = workers - 2 ** (rounds - 1) if i == 0 else distance
        inbox = []
        for w in range(workers):
            for j in range(count):
                b = (w + distance + j) % workers
                chosen = reference_topk(copies[w, b], k)
                inbox.append(((w + distance) % workers, b, chosen, copies[w, b, chosen].copy()))
                copies[w, b, chosen] = 0
        for w, b, chosen, values in inbox:
            copies[w, b, chosen] += values
    return copies


def reference_spardl(accumulated, density):
    """SparDL with one team written from the paper, sequentially, in numpy (float32)."""
    workers, n = accumulated.shape
    block = math.ceil(n / workers)
    k = max(1, int(block * density))
    copies = reference_srs(accumulated, k)
    result = np.zeros(workers * block, np.float32)
    present = np.zeros(workers * block, bool)
    for w in range(workers):
        chosen = reference_topk(copies[w, w], k)
        result[w * block + chosen] = copies[w, w, chosen] / np.float32(workers)
        present[w * block + chosen] = True
        copies[w, w, chosen] = 0
    flat = copies.reshape(workers, -1)[:, :n]
    residuals = np.where(present[:n], flat, accumulated)
    return result[:n], residuals


@pytest.mark.parametrize("workers", range(1, 17))
@pytest.mark.parametrize("numel,density", [(37, 0.1), (1000, 0.01), (2003, 0.05), (5, 0.5)])
def test_matches_reference_over_consecutive_calls(workers, numel, density):
    check_against_reference(workers, numel, density)


@pytest.mark.parametrize("workers", [3, 5, 8])
def test_matches_reference_with_blocks_long_enough_to_be_sampled(workers):
    """Blocks of 40,000 entries, where the selector's sampled estimate matters (in the small
    cases a sample covers most of a block); several blocks per round go to one row-wise
    selection."""
    check_against_reference(workers, 40_000 * workers + 3, 0.01)


@pytest.mark.parametrize("workers", [2, 3, 4, 7])
def test_matches_reference_when_many_values_tie(workers):
    """Gradients of small integers: many entries tie with a cut's k-th largest |x|, so the cuts
    break ties by position and global residual collection looks those up among a cut's columns."""
    numel = 3001
    grads = torch.from_numpy(
        np.random.default_rng(workers).integers(-3, 4, (3, workers, numel)).astype(np.float32)
    )
    check_against_reference(workers, numel, 0.05, grads)


def check_against_reference(workers, numel, density, grads=None):
    """Three consecutive calls (residuals carried) equal the numpy reference on every rank."""
    calls, _ = run_calls("spardl", workers, numel, density, calls=3, seed=workers, grads=grads)
    for call in calls:
        accumulated = (call["grads"] + call["before"]).numpy()
        expected, residuals = reference_spardl(accumulated, density)
        for result in call["results"]:
            np.testing.assert_allclose(result.numpy(), expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(call["after"].numpy(), residuals, rtol=1e-6, atol=1e-6)


def team_configurations():
    for workers in range(1, 17):
        yield workers, 1, "bruck"
    for workers, teams in TEAM_CASES:
        yield workers, teams, "bruck"
        if teams & (teams - 1) == 0:
            yield workers, teams, "recursive"


@pytest.mark.parametrize("workers,teams,sag", list(team_configurations()))
@pytest.mark.parametrize("numel", [3, 101, 4099])
@pytest.mark.parametrize("density", [0.001, 0.02, 0.3, 1.0])
def test_invariants(workers, teams, sag, numel, density):
    calls, _ = run_calls(
        "spardl", workers, numel, density, calls=3, seed=numel, teams=teams, sag=sag
    )
    team_size = workers // teams
    block = math.ceil(numel / team_size)
    budget = max(1, int(block * density))
    rounds = 2 * math.ceil(math.log2(team_size)) + math.ceil(math.log2(teams))
    for call in calls:
        first = call["results"][0]
        assert all(torch.equal(first, other) for other in call["results"]), "ranks disagree"
        error, scale = mass_error(call, workers)
        assert error <= 1e-5 * scale, f"mass not conserved: {error}"
        assert int(torch.count_nonzero(first)) <= team_size * budget
        for stats in call["stats"]:
            assert stats["rounds"] == rounds
            assert stats["nnz"] == int(torch.count_nonzero(first))
        if density == 1.0:
            dense = (call["grads"] + call["before"]).double().mean(0)
            np.testing.assert_allclose(first.double().numpy(), dense.numpy(), rtol=1e-5, atol=1e-5)
            assert float(call["after"].abs().max()) == 0.0
        if teams == 1:  # every block carries exactly k_b entries: the bytes are known exactly
            assert all(s["bytes_sent"] == 16 * (workers - 1) * budget for s in call["stats"])
            assert all(s["messages"] == 2 * math.ceil(math.log2(workers)) for s in call["stats"])


def test_bytes_with_teams_follow_the_cost_model():
    workers, teams, numel, density = 8, 2, 80000, 0.01
    calls, states = run_calls("spardl", workers, numel, density, calls=4, teams=teams)
    team_size = workers // teams
    budget = int(math.ceil(numel / team_size) * density)
    for call in calls:
        for stats in call["stats"]:
            srs = 8 * (team_size - 1) * budget
            sag = 8 * (teams - 1) * budget  # h <= k_b entries per other team
            gather = 8 * (team_size - 1) * budget + 4 * (team_size - 1)  # plus one count per block
            assert 8 * (team_size - 1) * budget <= stats["bytes_sent"] <= srs + sag + gather


def test_density_one_is_the_dense_average_for_every_team_count():
    workers, numel = 12, 1001
    grads = heavy_tailed((workers, numel), 3)
    for teams in (1, 2, 3, 4, 6, 12):

        def body(transport, teams=teams):
            sync = compressors.create("spardl", transport, numel=numel, density=1.0, teams=teams)
            return sync.allreduce(grads[transport.rank])

        results = local_group(workers).run(body)
        np.testing.assert_allclose(
            results[0].numpy(), grads.double().mean(0).numpy(), rtol=1e-5, atol=1e-6
        )


def test_state_dict_round_trip_continues_bit_identically():
    workers, numel, density = 6, 3000, 0.01
    grads = heavy_tailed((4, workers, numel), 9)

    def body(transport):
        options = dict(numel=numel, density=density, teams=2)
        first = compressors.create("spardl", transport, **options)
        for call in range(3):
            first.allreduce(grads[call, transport.rank])
        state = first.state_dict()
        expected = first.allreduce(grads[3, transport.rank])
        second = compressors.create("spardl", transport, **options)
        second.load_state_dict(state)
        again = second.allreduce(grads[3, transport.rank])
        return torch.equal(expected, again) and torch.equal(first.residual, second.residual)

    assert all(local_group(workers).run(body))


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(density=0.0), "density"),
        (dict(density=1.5), "density"),
        (dict(density=0.1, teams=4), "valid: 1, 2, 3, 6"),
        (dict(density=0.1, teams=3, sag="recursive"), "power of two"),
        (dict(density=0.1, sag="ring"), "bruck, recursive"),
        (dict(density=0.1, srs="tree"), "valid: rounds, blocks"),
        (dict(density=0.1, srs=None), "valid: rounds, blocks"),
        (dict(density=0.1, colour="red"), "unknown option"),
    ],
)
def test_bad_options_raise_value_error_naming_valid_choices(options, message):
    transport = local_group(6).rank(0)
    with pytest.raises(ValueError, match=message):
        compressors.create("spardl", transport, numel=100, **options)


def test_dense_warmup_runs_dense_then_sparse():
    calls, _ = run_calls("spardl", 4, 400, 0.01, calls=3, dense_warmup=2)
    for call in calls[:2]:
        np.testing.assert_allclose(
            call["results"][0].numpy(), call["grads"].double().mean(0).numpy(), rtol=1e-5, atol=1e-6
        )
        assert float(call["after"].abs().max()) == 0.0
    assert int(torch.count_nonzero(calls[2]["results"][0])) <= 4 * 1


def test_height_adapter_tracks_the_budget_within_bounds():
    adapter = HeightAdapter(block_budget=50, teams=4, block_size=5000)
    assert (
        adapter.value == 12 and adapter.step == 1
    )  # small blocks still move (the authors froze them)
    seen = []
    for _ in range(60):  # a union of about 3.5 h entries: the fixed point is h = 14 or 15
        adapter.update(int(3.5 * adapter.value))
        seen.append(adapter.value)
        assert 12 <= adapter.value <= 50
    assert set(seen[-10:]) <= {14, 15}


def test_a_deferred_union_size_updates_h_when_h_is_next_read():
    deferred, immediate = HeightAdapter(50, 4, 5000), HeightAdapter(50, 4, 5000)
    for size in (10, 80, 80, 30, 49, 51):
        deferred.defer(torch.tensor(size))
        immediate.update(size)
        assert deferred.value == immediate.value
    deferred.defer(torch.tensor(7))
    immediate.update(7)
    assert deferred.state_dict() == immediate.state_dict()  # a checkpoint reads it too
    restored = HeightAdapter(50, 4, 5000)
    restored.defer(torch.tensor(1000))
    restored.load_state_dict(immediate.state_dict())  # a loaded state drops what was pending
    assert restored.value == immediate.value


def test_height_is_fixed_with_one_team_or_at_full_density():
    assert HeightAdapter(50, 1, 5000).value == 50
    full = HeightAdapter(100, 4, 100)
    full.update(10)
    assert full.value == 100


def test_array_masks_keep_np_where_bits():
    """Step 6's masks on arrays (by the bits, not np.where) give np.where's bits exactly."""
    from compressors.spardl import _where, _zero_where

    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.5, 65504.0]
    values = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    values[0, : len(specials)] = specials
    other = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)
    other[1, : len(specials)] = specials
    mask = np.random.default_rng(2).random((3, 40)) < 0.5

    def bits(a):
        return np.ascontiguousarray(a).view(np.int32)

    assert np.array_equal(bits(_where(mask, values, other)), bits(np.where(mask, values, other)))
    zeroed = bits(_zero_where(mask, values))
    assert np.array_equal(zeroed, bits(np.where(mask, np.float32(0.0), values)))
    assert (zeroed[mask] == 0).all()  # +0, not -0
