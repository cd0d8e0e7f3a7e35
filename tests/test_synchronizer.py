"""The contract of the Synchronizer base class, kept by every registered method: the gradient is
left alone, an ``out`` buffer receives the result, bad input raises ``ValueError``, the stats."""
import pytest
import torch

import compressors
from comm import local_group
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


def test_unknown_method_lists_the_registry():
    with pytest.raises(ValueError, match="dense.*spardl"):
        compressors.create("sparseall", local_group(1).rank(0), numel=10, density=0.1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("grad", [torch.zeros(99), torch.zeros(100, dtype=torch.float64),
                                  torch.zeros(10, 10), [0.0] * 100])
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
