"""SparDL's residual rule: global residual collection (the default) against the local ablation."""

import math

import pytest
import torch

import compressors
from allreducers.transports import local_group
from tests.ranks import mass_error, run_calls

CASES = [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (5, 1), (6, 3), (8, 1), (8, 2), (12, 4)]


@pytest.mark.parametrize(
    "workers,teams,sag",
    [(p, d, "bruck") for p, d in CASES]
    + [(p, d, "recursive") for p, d in CASES if not d & (d - 1)],  # R-SAG: d a power of two
)
def test_local_residuals_keep_only_what_each_worker_did_not_send(workers, teams, sag):
    numel, density = 1003, 0.05
    options = dict(teams=teams, sag=sag)
    glob, _ = run_calls("spardl", workers, numel, density, calls=3, **options)
    local, states = run_calls(
        "spardl", workers, numel, density, calls=3, residuals="local", **options
    )
    # The first call starts from zero residuals: the rule changes only what is kept.
    for a, b in zip(glob[0]["results"], local[0]["results"]):
        assert torch.equal(a, b)
    team_size = workers // teams
    block = math.ceil(numel / team_size)
    for call in local:
        accumulated = call["grads"] + call["before"]
        after = call["after"]
        for result in call["results"][1:]:
            assert torch.equal(result, call["results"][0])  # the same bits on every rank
        # Each entry is this worker's own accumulated value, or 0 where its selection sent it.
        kept = after == accumulated
        assert bool((kept | (after == 0)).all())
        # A worker selects k_b columns of each of the m blocks once (its own block in step 3).
        sent = (~kept).sum(1)
        budget = max(1, int(block * density))
        assert int(sent.max()) <= team_size * budget
        if workers > 1:
            assert int(sent.min()) >= budget
        error, scale = mass_error(call, workers)
        if workers == 1:
            assert error <= 1e-5 * scale  # one worker sends nothing: nothing is lost
    if workers > 1:  # what later rounds discard is lost: mass is not conserved
        assert max(mass_error(call, workers)[0] for call in local) > 1e-3
        for call in glob:
            error, scale = mass_error(call, workers)
            assert error <= 1e-4 * scale
    assert all(state["config"]["residuals"] == "local" for state in states)


def test_local_residuals_at_a_16_bit_wire_keep_what_quantization_took_off():
    workers, numel = 4, 2001
    local, _ = run_calls("spardl", workers, numel, 0.05, residuals="local", wire="fp16")
    call = local[0]
    accumulated = call["grads"] + call["before"]
    changed = call["after"] != accumulated
    # Where a value was sent, what stays is the quantization error of what was sent (a sum of
    # at most P workers' values), at most 2^-11 of it.
    bound = 2.0**-11 * workers * float(accumulated.abs().max())
    assert bool(changed.any()) and float(call["after"][changed].abs().max()) <= bound
    assert bool((call["after"][changed] != 0).any())  # fp32 would have kept 0 there


def test_the_residual_rule_is_checked_recorded_and_exempts_local_from_mass_conservation():
    assert "residuals" in compressors.options("spardl")
    assert compressors.option_defaults("spardl")["residuals"] == "global"
    assert compressors.check_options("spardl", 4, residuals="local") == {"residuals": "local"}
    with pytest.raises(ValueError, match="residuals='none' is not a residual rule; valid: global"):
        compressors.check_options("spardl", 4, residuals="none")

    def body(transport):
        sync = compressors.create("spardl", transport, numel=100, density=0.1, residuals="local")
        sync.allreduce(torch.ones(100))
        state = sync.state_dict()
        other = compressors.create("spardl", transport, numel=100, density=0.1)
        return sync.conserves_mass, other.conserves_mass, other.state_mismatch(state)

    for local_conserves, global_conserves, mismatch in local_group(2).run(body):
        assert (local_conserves, global_conserves) == (False, True)
        assert "residuals 'local' (here 'global')" in mismatch
