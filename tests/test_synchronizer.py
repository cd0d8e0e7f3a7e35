"""The contract of the Synchronizer base class, kept by every registered method: the gradient is
left alone, an ``out`` buffer receives the result, bad input raises ``ValueError``, the stats."""

import re

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import GroupAborted, local_group
from tests.ranks import heavy_tailed, run_calls

METHODS = compressors.available()


@pytest.mark.parametrize("method", METHODS)
def test_gradient_is_not_modified(method):
    def body(transport):
        sync = compressors.create(method, transport, numel=500, density=0.05)
        grad = heavy_tailed(500, transport.rank)
        copy = grad.clone()
        for _ in range(2):  # the second call also meets a non-zero residual
            sync.allreduce(grad)
        return torch.equal(grad, copy)

    assert all(local_group(3).run(body))


@pytest.mark.parametrize("method", METHODS)
def test_stats_have_the_contract_keys(method):
    calls, _ = run_calls(method, 4, 1000, 0.01)
    stats = calls[0]["stats"][0]
    assert set(stats) >= {"bytes_sent", "messages", "rounds", "nnz", "seconds"}
    assert set(stats["seconds"]) >= {"select", "comm", "accumulate", "total"}
    assert stats["seconds"]["total"] >= stats["seconds"]["select"] >= 0 and stats["bytes_sent"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_out_buffer_receives_the_same_result(method):
    grads = heavy_tailed((2, 4, 700), 5)

    def body(transport):
        fresh = compressors.create(method, transport, numel=700, density=0.02)
        reused = compressors.create(method, transport, numel=700, density=0.02)
        out = torch.full((700,), 7.0)
        same = []
        for call in range(2):
            expected = fresh.allreduce(grads[call, transport.rank])
            got = reused.allreduce(grads[call, transport.rank], out=out)
            same.append(got is out and torch.equal(got, expected))
        return all(same)

    assert all(local_group(4).run(body))


def test_out_buffer_of_the_wrong_shape_is_rejected():
    sync = compressors.create("spardl", local_group(1).rank(0), numel=100, density=0.1)
    with pytest.raises(ValueError, match="out must be 1-D of length 100"):
        sync.allreduce(torch.zeros(100), out=torch.zeros(50))


@pytest.mark.parametrize("method", ["spardl", "topk", "gtopk", "oktopk"])
def test_an_out_buffer_sharing_the_residual_is_rejected(method):
    sync = compressors.create(method, local_group(1).rank(0), numel=100, density=0.1)
    sync.allreduce(torch.randn(100))
    with pytest.raises(ValueError, match="out shares memory with the residual"):
        sync.allreduce(torch.randn(100), out=sync.residual)


@pytest.mark.parametrize("method,options", [("dense", {}), ("topk", {"dense_warmup": 1})])
def test_a_strided_out_buffer_gets_the_dense_average(method, options):
    grads = heavy_tailed((3, 301), 6)

    def body(transport):
        sync = compressors.create(method, transport, numel=301, density=0.1, **options)
        out = torch.zeros(602)[::2]
        assert sync.allreduce(grads[transport.rank], out=out) is out
        return out

    for out in local_group(3).run(body):  # under MPI too: tests/mpi_check_core.py
        np.testing.assert_allclose(
            out.numpy(), grads.double().mean(0).numpy(), rtol=1e-5, atol=1e-6
        )


def test_unknown_method_lists_the_registry():
    with pytest.raises(ValueError, match="dense.*spardl"):
        compressors.create("sparseall", local_group(1).rank(0), numel=10, density=0.1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "grad",
    [
        torch.zeros(99),
        torch.zeros(100, dtype=torch.float64),
        torch.zeros(10, 10),
        [0.0] * 100,
        torch.zeros(100).to_sparse(),
        torch.zeros(100, device="meta"),
    ],
)
def test_bad_gradients_raise_value_error(method, grad):
    sync = compressors.create(method, local_group(1).rank(0), numel=100, density=0.1)
    with pytest.raises(ValueError, match="gradient"):
        sync.allreduce(grad)


@pytest.mark.parametrize("method", METHODS)
def test_load_state_dict_restores_the_residual_in_place(method):
    """Into the residual's own buffer: spardl keeps it inside its padded blocks, and a new tensor
    would cost a copy of n entries on the next call."""

    def body(transport):
        sync = compressors.create(method, transport, numel=700, density=0.02)
        sync.allreduce(heavy_tailed(700, transport.rank))
        state = sync.state_dict()
        sync.allreduce(heavy_tailed(700, 10 + transport.rank))
        buffer = sync.residual.data_ptr()
        sync.load_state_dict(state)
        return sync.residual.data_ptr() == buffer and torch.equal(sync.residual, state["residual"])

    assert all(local_group(3).run(body))


def spardl_state(workers=4, **options):
    """Rank 0's state of spardl on ``workers`` in-process ranks after two calls."""

    def body(transport):
        sync = compressors.create(
            "spardl", transport, numel=1000, **dict(dict(density=0.05), **options)
        )
        for call in range(2):
            sync.allreduce(heavy_tailed(1000, 10 * call + transport.rank))
        return sync.state_dict()

    return local_group(workers).run(body)[0]


@pytest.mark.parametrize(
    "workers,options,message",
    [
        (4, {"density": 0.1}, "density 0.05 (here 0.1)"),
        (2, {"density": 0.05}, "workers 4 (here 2)"),
        (4, {"density": 0.05, "teams": 2}, "teams 1 (here 2)"),
    ],
)
def test_a_state_saved_with_other_settings_is_refused(workers, options, message):
    """SparDL's h and Ok-Topk's regions depend on the density, P and teams: loading them into
    another configuration used to crash a later call (malformed message) or run silently at the
    old density."""
    state = spardl_state()
    sync = compressors.create("spardl", local_group(workers).rank(0), numel=1000, **options)
    assert message in sync.state_mismatch(state)
    with pytest.raises(ValueError, match=re.escape(message)):
        sync.load_state_dict(state)


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        {"method": "spardl", "numel": 1000},
        {"method": "spardl", "numel": 1000, "calls": 1, "residual": torch.ones(1)},
    ],
)
def test_a_malformed_state_is_a_value_error(state):
    sync = compressors.create("spardl", local_group(1).rank(0), numel=1000, density=0.05)
    with pytest.raises(ValueError, match="not a synchronizer state|residual of shape"):
        sync.load_state_dict(state)


@pytest.mark.parametrize("method", METHODS)
def test_a_gradient_that_requires_grad_is_read_as_data(method):
    def body(transport):
        sync = compressors.create(method, transport, numel=300, density=0.5)
        grad = heavy_tailed(300, transport.rank).requires_grad_()
        result = sync.allreduce(grad)
        return result.requires_grad or sync.residual.requires_grad or result.grad_fn is not None

    assert not any(local_group(2).run(body))


def test_numpy_integers_are_accepted_and_strings_bools_and_huge_sizes_refused():
    transport = local_group(2).rank(0)
    sync = compressors.create(
        "spardl", transport, numel=np.int64(100), density=0.5, teams=np.int64(2)
    )
    assert (sync.numel, sync.teams) == (100, 2) and type(sync.teams) is int
    oktopk = compressors.create(
        "oktopk", transport, numel=100, density=0.5, raise_scale=np.float32(1.5)
    )
    assert oktopk.raise_scale == 1.5 and type(oktopk.raise_scale) is float
    for density in ("0.5", True):
        with pytest.raises(ValueError, match="density must be a number"):
            compressors.create("topk", transport, numel=100, density=density)
    with pytest.raises(ValueError, match="int32 indices"):
        compressors.create("topk", transport, numel=2**31, density=0.01)


def test_a_group_aborted_by_a_failed_run_says_so():
    group = local_group(2)
    with pytest.raises(ZeroDivisionError):
        group.run(lambda transport: 1 / 0)
    with pytest.raises(GroupAborted, match="run on a new one"):
        group.run(lambda transport: transport.rank)


def test_a_world_of_one_under_a_launcher_of_several_warns(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(RuntimeWarning, match="communicator has 1 rank, but WORLD_SIZE is 2"):
        compressors.create("spardl", local_group(1).rank(0), numel=10, density=0.5)
    monkeypatch.setenv("WORLD_SIZE", "1")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compressors.create("spardl", local_group(1).rank(0), numel=10, density=0.5)
