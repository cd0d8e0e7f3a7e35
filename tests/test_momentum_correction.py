"""DGC's momentum correction and density warm-up, options of every error-feedback method."""

import io

import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.base import WARMUP_DENSITIES, warmup_density
from compressors.residuals import ResidualStore
from tests.ranks import heavy_tailed, run_calls

FEEDBACK = [name for name in compressors.available() if compressors.resolve(name).uses_residual]
CONSERVING = [name for name in FEEDBACK if compressors.resolve(name).conserves_mass]


def run(method, grads, density, **options):
    """Every rank's results per call, and the synchronizers, for ``grads`` (calls, P, n)."""
    calls, workers, numel = grads.shape

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        return [sync.allreduce(grads[c, transport.rank].clone()) for c in range(calls)], sync

    return local_group(workers).run(body)


def dgc_topk(grads, density, momentum, nesterov=False):
    """DGC's algorithm with TopkA's selection, written out: the averages per call."""
    calls, workers, numel = grads.shape
    k = max(1, int(numel * density))
    u = torch.zeros(workers, numel, dtype=torch.float64)
    v = torch.zeros(workers, numel, dtype=torch.float64)
    averages = []
    for c in range(calls):
        g = grads[c].double()
        if nesterov:
            u = momentum * (u + g)
            v += u + g
        else:
            u = momentum * u + g
            v += u
        total = torch.zeros(numel, dtype=torch.float64)
        for r in range(workers):
            chosen = v[r].abs().topk(k).indices
            total[chosen] += v[r, chosen]
            u[r, chosen] = 0.0  # momentum-factor masking
            v[r, chosen] = 0.0
        averages.append(total / workers)
    return averages


@pytest.mark.parametrize("nesterov", [False, True])
def test_topk_with_momentum_correction_is_dgc(nesterov):
    grads = heavy_tailed((5, 3, 200), seed=1)
    per_rank = run("topk", grads, 0.05, momentum=0.9, nesterov=nesterov)
    for c, expected in enumerate(dgc_topk(grads, 0.05, 0.9, nesterov)):
        for results, _ in per_rank:
            torch.testing.assert_close(results[c].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", FEEDBACK)
def test_every_rank_gets_the_same_bits_and_the_velocity_is_masked_where_sent(method):
    grads = heavy_tailed((4, 4, 301), seed=2)
    per_rank = run(method, grads, 0.05, momentum=0.9)
    for c in range(4):
        for results, _ in per_rank[1:]:
            assert torch.equal(results[c], per_rank[0][0][c])
    emptied = [sync.residual == 0 for _, sync in per_rank]
    assert any(entries.any() for entries in emptied)  # gTop-k may put a rank's values back
    for entries, (_, sync) in zip(emptied, per_rank):
        assert (sync.velocity[entries] == 0).all()
        assert (sync.velocity[~entries] != 0).any()


@pytest.mark.parametrize("method", CONSERVING)
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_mass_is_conserved_in_v(method, workers):
    """sum_r v_r = P * average + sum_r residual_r after the call, with v = residual + u."""
    grads = heavy_tailed((3, workers, 157), seed=3)

    def body(transport):
        sync = compressors.create(method, transport, numel=157, density=0.1, momentum=0.8)
        rows = []
        for c in range(3):
            velocity = sync.velocity.clone()
            u = 0.8 * velocity + grads[c, transport.rank]
            v = sync.residual.double() + u.double()
            result = sync.allreduce(grads[c, transport.rank].clone())
            rows.append((v, result.double(), sync.residual.double()))
        return rows

    per_rank = local_group(workers).run(body)
    for c in range(3):
        v = sum(rows[c][0] for rows in per_rank)
        after = workers * per_rank[0][c][1] + sum(rows[c][2] for rows in per_rank)
        torch.testing.assert_close(v, after, rtol=0, atol=1e-4)


@pytest.mark.parametrize("method", FEEDBACK)
def test_at_density_one_masking_leaves_plain_sgd(method):
    """Every entry is sent, so u is zeroed every call and each average is the gradients'."""
    grads = heavy_tailed((3, 2, 64), seed=4)
    plain = run(method, grads, 1.0)
    corrected = run(method, grads, 1.0, momentum=0.9)
    for c in range(3):
        torch.testing.assert_close(corrected[0][0][c], plain[0][0][c], rtol=0, atol=1e-6)
        torch.testing.assert_close(corrected[0][0][c], grads[c].mean(0), rtol=1e-6, atol=1e-6)


def test_dense_warmup_calls_are_momentum_sgd():
    grads = heavy_tailed((3, 2, 50), seed=5)
    per_rank = run("spardl", grads, 0.1, momentum=0.5, dense_warmup=3)
    buffer = torch.zeros(50)
    for c in range(3):
        buffer = 0.5 * buffer + grads[c].mean(0)
        torch.testing.assert_close(per_rank[0][0][c], buffer, rtol=1e-6, atol=1e-6)
    assert per_rank[0][1].residual.abs().sum() == 0  # untouched meanwhile


def test_density_warmup_follows_dgcs_stages_then_the_density():
    assert WARMUP_DENSITIES == (0.25, 0.0625, 0.015625, 0.00390625)
    stages = [warmup_density(call, 8, 0.01) for call in range(10)]
    assert stages == [0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.01, 0.01, 0.01, 0.01]
    assert warmup_density(0, 0, 0.01) == 0.01


@pytest.mark.parametrize("method", ["topk", "spardl"])
def test_a_warmup_stage_is_the_method_at_the_stage_density_on_the_same_residual(method):
    grads = heavy_tailed((3, 2, 400), seed=6)
    warm, _ = run_calls(method, 2, 400, 0.01, calls=3, grads=grads, density_warmup=8)
    # Calls 0-1 run at 25%, call 2 at 6.25%, each from the residual the call before left.
    first, _ = run_calls(method, 2, 400, 0.25, calls=2, grads=grads[:2])
    for c in range(2):
        assert torch.equal(warm[c]["results"][0], first[c]["results"][0])
        assert torch.equal(warm[c]["after"], first[c]["after"])
    assert warm[0]["stats"][0]["bytes_sent"] > 10 * warm[2]["stats"][0]["bytes_sent"] / 4


def test_velocity_survives_a_state_dict_round_trip():
    grads = heavy_tailed((4, 2, 90), seed=7)
    straight = run("spardl", grads, 0.05, momentum=0.9)

    def body(transport):
        first = compressors.create("spardl", transport, numel=90, density=0.05, momentum=0.9)
        for c in range(2):
            first.allreduce(grads[c, transport.rank].clone())
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)
        buffer.seek(0)
        again = compressors.create("spardl", transport, numel=90, density=0.05, momentum=0.9)
        again.load_state_dict(torch.load(buffer, weights_only=True))
        return [again.allreduce(grads[c, transport.rank].clone()) for c in (2, 3)]

    resumed = local_group(2).run(body)
    for rank in range(2):
        assert torch.equal(resumed[rank][1], straight[rank][0][3])


def test_the_velocity_follows_its_parameter_across_bucket_layouts():
    transport = local_group(1).rank(0)

    def build(numel):
        return compressors.create("topk", transport, numel=numel, density=0.1, momentum=0.9)

    store = ResidualStore()
    old = store.layout(["a", "b"], [2, 3], build)
    old.sync.velocity[:] = torch.tensor([1.0, 1.0, 2.0, 2.0, 2.0])
    new = store.layout(["b", "a"], [3, 2], build)
    assert new.sync.velocity.tolist() == [2.0, 2.0, 2.0, 1.0, 1.0]
    assert old.sync.velocity.abs().sum() == 0  # moved, not copied
    saved = ResidualStore()
    saved.load_state_dict(store.state_dict())
    assert saved.layout(["a"], [2], build).sync.velocity.tolist() == [1.0, 1.0]


def test_the_options_are_offered_checked_and_parsed():
    assert {"momentum", "nesterov", "density_warmup"} <= set(compressors.options("spardl"))
    assert compressors.option_defaults("zen")["momentum"] == 0.0
    assert "momentum" not in compressors.options("dense")
    assert compressors.parse_option("spardl", "momentum", "0.9") == 0.9
    assert compressors.parse_option("topk", "nesterov", "true") is True
    for bad, message in [
        ({"momentum": 1.0}, "momentum must lie in"),
        ({"momentum": "x"}, "momentum must be a number"),
        ({"nesterov": True}, "nesterov=true needs momentum > 0"),
        ({"density_warmup": -1}, "density_warmup must be an integer >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            compressors.check_options("spardl", 4, **bad)
    with pytest.raises(ValueError, match="unknown option"):
        compressors.create("dense", local_group(1).rank(0), numel=4, momentum=0.9)
