"""Reduce-scatter by every method (FSDP's layout), and FSDP2 itself under torchrun."""

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import local_group
from tests.mpirun import torchrun
from tests.ranks import heavy_tailed

METHODS = compressors.available()


def reduce_scatter(method, grads, density, group=local_group, **options):
    """Every rank's shards per call for ``grads`` (calls, P, n), with residuals before/after.

    ``group(P)`` makes the in-process group.
    """
    calls, workers, numel = grads.shape

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        rows = []
        for call in range(calls):
            before = sync.residual.clone()
            shard = sync.reduce_scatter(grads[call, transport.rank].clone())
            rows.append((before, shard, sync.residual.clone()))
        return rows

    return group(workers).run(body)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_density_one_gives_each_rank_its_shard_of_the_average(method, workers):
    grads = heavy_tailed((1, workers, 6 * workers), seed=workers)
    shards = [rows[0][1] for rows in reduce_scatter(method, grads, 1.0)]
    torch.testing.assert_close(torch.cat(shards), grads[0].mean(0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("wire", ["fp32", "fp16"])
def test_spardl_reduce_scatter_conserves_mass(workers, wire):
    """sum_w (grad_w + residual_w) = P * shards joined + sum_w residual_w, call after call."""
    grads = heavy_tailed((3, workers, 31 * workers), seed=workers)
    per_rank = reduce_scatter("spardl", grads, 0.1, wire=wire)
    for call in range(3):
        before = grads[call].double().sum(0) + sum(rows[call][0].double() for rows in per_rank)
        shards = torch.cat([rows[call][1].double() for rows in per_rank])
        after = workers * shards + sum(rows[call][2].double() for rows in per_rank)
        torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert all(rows[-1][1].numel() == 31 for rows in per_rank)  # the own shard


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("density", [0.05, 0.3])
def test_spardl_reduce_scatter_matches_the_numpy_reference(workers, density):
    """Each rank's shard is its block after the paper's Spar-Reduce-Scatter (numpy, float32),
    divided by P, and its residual that rank's copy with the own block emptied, call after call
    (residuals carried)."""
    from tests.test_spardl import reference_srs

    block = 37
    grads = heavy_tailed((3, workers, block * workers), seed=workers)
    per_rank = reduce_scatter("spardl", grads, density)
    k = max(1, int(block * density))
    for call in range(3):
        before = torch.stack([rows[call][0] for rows in per_rank])
        copies = reference_srs((grads[call] + before).numpy(), k)
        for w, rows in enumerate(per_rank):
            _, shard, after = rows[call]
            expected = copies[w, w] / np.float32(workers)
            np.testing.assert_allclose(shard.numpy(), expected, rtol=1e-6, atol=1e-7)
            residual = copies[w].copy()
            residual[w] = 0
            np.testing.assert_allclose(after.numpy(), residual.reshape(-1), rtol=1e-6, atol=1e-6)


def test_spardl_reduce_scatter_sends_less_than_its_all_reduce():
    grads = heavy_tailed((1, 4, 400), seed=9)

    def body(transport):
        sync = compressors.create("spardl", transport, numel=400, density=0.05)
        sync.reduce_scatter(grads[0, transport.rank].clone())
        scattered = sync.stats["bytes_sent"]
        sync.allreduce(grads[0, transport.rank].clone())
        return scattered, sync.stats["bytes_sent"]

    for scattered, reduced in local_group(4).run(body):
        assert 0 < scattered < reduced


def test_a_vector_not_split_evenly_is_refused():
    one = compressors.create("topk", local_group(1).rank(0), numel=7, density=0.5)
    assert one.reduce_scatter(torch.ones(7)).numel() == 7  # one rank: one shard
    two = compressors.create("topk", local_group(2).rank(0), numel=7, density=0.5)
    with pytest.raises(ValueError, match="multiple of the 2 ranks"):
        two.reduce_scatter(torch.ones(7))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
def test_fsdp2_with_the_sparse_reduce_scatter_and_replica_hook(workers):
    run = torchrun(workers, "tests/fsdp_check.py", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"fsdp checks passed on {workers} ranks" in run.stdout
