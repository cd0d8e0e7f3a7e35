"""``srs="blocks"`` (the SRS round table one block per step, as the authors' code runs it) gives
the bits of ``srs="rounds"``; only messages and rounds differ."""

import math

import pytest
import torch

import compressors
from allreducers.transports import local_group
from tests.ranks import heavy_tailed, run_calls

CONFIGURATIONS = [
    (2, 1, "bruck"),
    (3, 1, "bruck"),
    (5, 1, "bruck"),
    (6, 1, "bruck"),
    (8, 1, "bruck"),
    (6, 2, "bruck"),
    (9, 3, "bruck"),
    (8, 2, "recursive"),
    (8, 4, "recursive"),
]


@pytest.mark.parametrize("workers,teams,sag", CONFIGURATIONS)
@pytest.mark.parametrize("numel,density", [(1001, 0.02), (50, 0.3)])
def test_blocks_give_the_bits_of_rounds_with_m_minus_1_srs_steps(
    workers, teams, sag, numel, density
):
    grads = heavy_tailed((3, workers, numel), workers * numel)
    options = dict(calls=3, grads=grads, teams=teams, sag=sag)
    rounds, _ = run_calls("spardl", workers, numel, density, srs="rounds", **options)
    blocks, _ = run_calls("spardl", workers, numel, density, srs="blocks", **options)
    m = workers // teams
    sag_rounds = math.ceil(math.log2(teams))
    for by_round, by_block in zip(rounds, blocks):
        assert all(torch.equal(a, b) for a, b in zip(by_round["results"], by_block["results"]))
        assert torch.equal(by_round["after"], by_block["after"])
        for fast, slow in zip(by_round["stats"], by_block["stats"]):
            assert slow["bytes_sent"] == fast["bytes_sent"]
            assert fast["rounds"] == 2 * math.ceil(math.log2(m)) + sag_rounds
            assert slow["rounds"] == (m - 1) + sag_rounds + math.ceil(math.log2(m))
            assert slow["messages"] - fast["messages"] == (m - 1) - math.ceil(math.log2(m))


def test_state_records_the_execution():
    _, (state, *_) = run_calls("spardl", 2, 10, 0.5, srs="blocks")
    assert state["config"]["srs"] == "blocks"
    sync = compressors.create("spardl", local_group(2).rank(0), numel=10, density=0.5)
    assert "srs 'blocks' (here 'rounds')" in sync.state_mismatch(state)
