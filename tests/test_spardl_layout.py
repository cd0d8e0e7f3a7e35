"""SparDL's team layouts (block, strided) and teams="auto" on in-process groups."""

import math

import numpy as np
import pytest
import torch

import compressors
import compressors.teams as teams_module
from allreducers.transports import local_group
from compressors.teams import candidates, team_groups
from tests.ranks import heavy_tailed, mass_error, run_calls


def test_strided_teams_take_every_d_th_rank():
    # P = 8 as 2 hosts of 4 ranks: strided d = 4 pairs the ranks of one local index.
    assert team_groups(5, 4, 8, "strided") == (1, 1, [1, 5], [4, 5, 6, 7])
    assert team_groups(5, 2, 8, "block") == (1, 1, [4, 5, 6, 7], [1, 5])
    for workers, d in [(6, 2), (6, 3), (8, 4)]:
        for layout in ("block", "strided"):
            teams = [team_groups(r, d, workers, layout) for r in range(workers)]
            for rank, (team, position, members, holders) in enumerate(teams):
                assert members[position] == rank and holders[team] == rank
            distinct = {tuple(members) for _, _, members, _ in teams}
            assert len(distinct) == d
            assert sorted(r for members in distinct for r in members) == list(range(workers))


@pytest.mark.parametrize(
    "workers,d,sag",
    [(4, 2, "bruck"), (6, 2, "bruck"), (6, 3, "bruck"), (8, 4, "bruck"), (8, 2, "recursive")],
)
@pytest.mark.parametrize("density", [0.02, 1.0])
def test_strided_layout_keeps_the_invariants(workers, d, sag, density):
    numel = 1001
    calls, _ = run_calls(
        "spardl", workers, numel, density, calls=3, teams=d, sag=sag, layout="strided"
    )
    team_size = workers // d
    rounds = 2 * math.ceil(math.log2(team_size)) + math.ceil(math.log2(d))
    for call in calls:
        first = call["results"][0]
        assert all(torch.equal(first, other) for other in call["results"]), "ranks disagree"
        error, scale = mass_error(call, workers)
        assert error <= 1e-5 * scale, f"mass not conserved: {error}"
        assert all(stats["rounds"] == rounds for stats in call["stats"])
        if density == 1.0:
            dense = (call["grads"] + call["before"]).double().mean(0)
            np.testing.assert_allclose(first.double().numpy(), dense.numpy(), rtol=1e-5, atol=1e-5)


def test_layouts_agree_where_they_are_the_same_teams():
    grads = heavy_tailed((2, 4, 500), 3)
    for d in (1, 4):
        results = [
            run_calls("spardl", 4, 500, 0.05, calls=2, grads=grads, teams=d, layout=layout)[0]
            for layout in ("block", "strided")
        ]
        for block, strided in zip(*results):
            assert torch.equal(block["results"][0], strided["results"][0])


def test_teams_auto_is_parsed_checked_and_listed():
    assert compressors.parse_option("spardl", "teams", "auto") == "auto"
    assert compressors.parse_option("spardl", "teams", "2") == 2
    assert compressors.try_options("spardl", 4, teams="auto")["teams"] == "auto"
    with pytest.raises(ValueError, match="valid: 1, 2, 4 or 'auto'"):
        compressors.check_options("spardl", 4, teams=3)
    with pytest.raises(ValueError, match="block, strided"):
        compressors.check_options("spardl", 4, layout="ring")
    assert candidates(1) == [(1, "bruck", "block")]
    assert len(candidates(8)) == 11 and len(set(candidates(8))) == 11


def test_teams_auto_equals_its_choice_bit_for_bit_and_resumes_without_a_probe(monkeypatch):
    workers, numel, density = 4, 3000, 0.01
    grads = heavy_tailed((4, workers, numel), 4)

    def body(transport):
        auto = compressors.create("spardl", transport, numel=numel, density=density, teams="auto")
        assert auto.state_dict()["config"]["teams"] is None  # nothing chosen before a call
        results = [auto.allreduce(grads[call, transport.rank]) for call in range(3)]
        chosen = {key: auto.auto[key] for key in ("teams", "sag", "layout")}
        fixed = compressors.create("spardl", transport, numel=numel, density=density, **chosen)
        same = all(
            torch.equal(result, fixed.allreduce(grads[call, transport.rank]))
            for call, result in enumerate(results)
        )
        state = auto.state_dict()
        resumed = compressors.create(
            "spardl", transport, numel=numel, density=density, teams="auto"
        )
        resumed.load_state_dict(state)  # takes the saved choice: no probe
        again = resumed.allreduce(grads[3, transport.rank])
        expected = auto.allreduce(grads[3, transport.rank])
        return (
            chosen,
            auto.stats["auto"]["probe"],
            state["config"]["teams_requested"],
            same and torch.equal(again, expected) and torch.equal(resumed.residual, auto.residual),
        )

    monkeypatch.setattr(teams_module, "PROBE_SECONDS", 5.0)
    original = teams_module.probe
    probes = []

    def counted(*args, **kwargs):
        probes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(compressors.spardl, "probe", counted)
    out = local_group(workers).run(body)
    assert all(o[0] == out[0][0] and o[1] == out[0][1] for o in out), "ranks chose differently"
    assert len(out[0][1]) == len(candidates(workers))
    assert all(o[2] == "auto" and o[3] for o in out)
    assert len(probes) == workers  # one probe per rank: the resumed synchronizer ran none


def test_teams_auto_on_one_rank_chooses_without_a_probe():
    sync = compressors.create("spardl", local_group(1).rank(0), numel=50, density=0.1, teams="auto")
    assert sync.auto["teams"] == 1 and sync.auto["probe"] == []
    fixed = compressors.create("spardl", local_group(1).rank(0), numel=50, density=0.1)
    grad = heavy_tailed(50, 1)
    assert torch.equal(sync.allreduce(grad), fixed.allreduce(grad))
    assert sync.stats["auto"]["teams_requested"] == "auto"
