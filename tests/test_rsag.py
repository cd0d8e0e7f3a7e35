"""R-SAG (``sag="recursive"``): the authors' recursive pairwise reduction, against a plain numpy
reference written from its description, a case built by hand, and mass conservation."""

import math

import numpy as np
import pytest
import torch

from tests.ranks import mass_error, run_calls
from tests.test_spardl import reference_srs, reference_topk


def reference_rsag(accumulated, teams, density):
    """SparDL with R-SAG, sequentially in numpy (float32): SRS in each team, each holder's own
    top-k_b, then per block log2(d) pair steps (partner t XOR d/2, d/4, ...; the lower team's
    list first; top-k_b of the union; each of the 2^(s+1) holders behind a step's cut keeps
    1/2^(s+1) of what it dropped), then global residual collection. Returns the result, the
    residuals, and how many drops reached the final list through another pair."""
    workers, n = accumulated.shape
    m = workers // teams
    block = math.ceil(n / m)
    k = max(1, int(block * density))
    copies = np.concatenate(
        [reference_srs(accumulated[t * m : (t + 1) * m], k) for t in range(teams)]
    )
    shares = np.zeros_like(copies)
    result = np.zeros(m * block, np.float32)
    present = np.zeros(m * block, bool)
    rescued = 0
    for r in range(m):
        lists = []
        for t in range(teams):
            chosen = reference_topk(copies[t * m + r, r], k)
            lists.append(dict(zip(chosen.tolist(), copies[t * m + r, r, chosen])))
            copies[t * m + r, r, chosen] = 0
        dropped_columns = []
        for s in range(int(math.log2(teams))):
            merged = []
            for t in range(teams):
                low, high = sorted((t, t ^ (teams >> (s + 1))))
                union = dict(lists[low])
                for column, value in lists[high].items():
                    union[column] = np.float32(union.get(column, np.float32(0)) + value)
                columns = np.array(sorted(union))
                values = np.array([union[c] for c in columns], np.float32)
                if len(columns) > k:
                    keep = reference_topk(values, k)
                    drop = np.setdiff1d(np.arange(len(columns)), keep)
                    shares[t * m + r, r, columns[drop]] += values[drop] / np.float32(2 ** (s + 1))
                    dropped_columns += columns[drop].tolist()
                    columns, values = columns[keep], values[keep]
                merged.append(dict(zip(columns.tolist(), values)))
            lists = merged
        assert all(final == lists[0] for final in lists), "holders disagree"
        columns = np.array(sorted(lists[0]))
        result[r * block + columns] = np.array(
            [lists[0][c] for c in columns], np.float32
        ) / np.float32(workers)
        present[r * block + columns] = True
        rescued += sum(column in lists[0] for column in dropped_columns)
    flat = (copies + shares).reshape(workers, -1)[:, :n]
    return result[:n], np.where(present[:n], flat, accumulated), rescued


CASES = [(2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)]


@pytest.mark.parametrize("workers,teams", CASES)
@pytest.mark.parametrize("numel,density", [(37, 0.1), (203, 0.05), (64, 0.3)])
def test_matches_the_reference_and_conserves_mass_over_calls(workers, teams, numel, density):
    calls, _ = run_calls(
        "spardl",
        workers,
        numel,
        density,
        calls=3,
        seed=numel + workers,
        teams=teams,
        sag="recursive",
    )
    for call in calls:
        accumulated = (call["grads"] + call["before"]).numpy()
        expected, residuals, _ = reference_rsag(accumulated, teams, density)
        for result in call["results"]:
            assert torch.equal(result, call["results"][0]), "ranks disagree"
        np.testing.assert_allclose(call["results"][0].numpy(), expected, rtol=1e-6, atol=1e-7)
        assert np.array_equal(call["results"][0].numpy() != 0, expected != 0)
        np.testing.assert_allclose(call["after"].numpy(), residuals, rtol=1e-6, atol=1e-6)
        error, scale = mass_error(call, workers)
        assert error <= 1e-5 * scale, f"mass not conserved: {error}"


def test_the_reference_cases_include_drops_that_reach_the_final_list_through_another_pair():
    """The shares at final-list coordinates matter in the random cases above, not only in the
    built one below: the comparison there would catch a rule that drops them."""
    rescued = 0
    for workers, teams in [(4, 4), (8, 4), (8, 8)]:
        grads = (
            np.random.default_rng(workers + teams).standard_t(3, (workers, 64)).astype(np.float32)
        )
        rescued += reference_rsag(grads, teams, 0.3)[2]
    assert rescued > 0


def test_built_case_differs_from_b_sag_and_keeps_the_halves_of_a_rescued_drop():
    """P = d = 4, k_b = 2. Step 0 (pairs 0-2, 1-3): pair 0-2 drops columns 2 and 3 (values 1
    and 0.5), pair 1-3 keeps them (9 and 8); step 1 keeps {2: 9, 3: 8}. Workers 0 and 2 each
    keep half of the dropped 1 and 0.5, at coordinates that are in the final list. B-SAG
    (h = 1) gathers {0: 5}, {2: 9}, {2: 1}, {3: 8} and keeps {2: 10, 3: 8}."""
    grads = torch.tensor([[[5, 4, 0, 0], [0.1, 0, 9, 0], [0, 0, 1, 0.5], [0, 0.2, 0, 8]]])
    recursive, _ = run_calls("spardl", 4, 4, 0.5, grads=grads, teams=4, sag="recursive")
    bruck, _ = run_calls("spardl", 4, 4, 0.5, grads=grads, teams=4, sag="bruck")
    assert recursive[0]["results"][0].tolist() == [0, 0, 9 / 4, 8 / 4]
    assert bruck[0]["results"][0].tolist() == [0, 0, 10 / 4, 8 / 4]
    assert recursive[0]["after"].tolist() == [
        [5, 4, 0.5, 0.25],
        [np.float32(0.1), 0, 0, 0],
        [0, 0, 0.5, 0.25],
        [0, np.float32(0.2), 0, 0],
    ]
    error, scale = mass_error(recursive[0], 4)
    assert error == 0.0


@pytest.mark.parametrize("workers,teams", [(8, 2), (8, 4), (8, 8)])
def test_cost_log2_d_messages_of_k_b_entries(workers, teams):
    numel, density = 4096, 0.02
    calls, _ = run_calls("spardl", workers, numel, density, calls=2, teams=teams, sag="recursive")
    team_size = workers // teams
    budget = max(1, int(math.ceil(numel / team_size) * density))
    steps = int(math.log2(teams))
    srs = 8 * (team_size - 1) * budget
    gather_rounds = math.ceil(math.log2(team_size))
    for call in calls:
        for stats in call["stats"]:
            assert stats["rounds"] == 2 * gather_rounds + steps
            assert stats["messages"] == 2 * gather_rounds + steps
            # the final gather carries every block's final list: k_b entries, no counts
            gather = 8 * (team_size - 1) * budget
            assert stats["bytes_sent"] == srs + 8 * budget * steps + gather
