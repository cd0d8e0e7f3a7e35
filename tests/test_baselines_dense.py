"""``dense`` at the speed of the bare all-reduce: out-of-place sums, one pass to divide and count."""
import math

import pytest
import torch

import compressors
from comm import local_group
from comm.recording import RecordingTransport
from compressors.base import _PIECE, divide_and_count
from tests.ranks import heavy_tailed


def awkward(numel, seed):
    """Values over many magnitudes with exact zeros, negative zeros, a NaN and subnormals."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(numel, generator=generator) * torch.exp(20 * torch.randn(numel, generator=generator))
    values[::7] = 0.0
    values[1::11] = -0.0
    values[5 % numel] = float("nan")
    values[6 % numel] = 1e-45
    return values


@pytest.mark.parametrize("numel", [1, 13, _PIECE, 2 * _PIECE + 5])
@pytest.mark.parametrize("divisor", [1, 3, 4, 7])
def test_divide_and_count_is_div_then_count_nonzero(numel, divisor):
    values = awkward(numel, numel + divisor)
    expected = values.clone().div_(divisor)
    count = divide_and_count(values, divisor)
    assert torch.equal(values.view(torch.int32), expected.view(torch.int32))
    assert type(count) is int and count == int(torch.count_nonzero(expected))


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_dense_is_the_ordered_sum_over_p_into_any_buffer(workers):
    numel = 2 * _PIECE + 3
    grads = heavy_tailed((workers, numel), workers)
    grads[:, ::5] = 0.0  # zero on every rank: zero in the result, left out of nnz
    total = grads[0].clone()
    for grad in grads[1:]:
        total += grad  # the in-process all-reduce sums in rank order
    expected = total / workers

    def body(transport):
        recorder = RecordingTransport(transport)
        sync = compressors.create("dense", recorder, numel=numel)
        grad = grads[transport.rank].clone()
        results = [sync.allreduce(grad), sync.allreduce(grad, out=torch.empty(numel)),
                   sync.allreduce(grad, out=torch.empty(2 * numel)[::2])]
        assert torch.equal(grad, grads[transport.rank]), "the gradient was modified"
        results.append(sync.allreduce(grad, out=grad))
        assert results[-1] is grad
        return results, dict(sync.stats), recorder.take()

    for results, stats, events in local_group(workers).run(body):
        assert all(torch.equal(result, expected) for result in results)
        assert stats["nnz"] == int(torch.count_nonzero(expected)) < numel
        steps = 2 * math.ceil(math.log2(workers))
        assert (stats["rounds"], stats["messages"]) == (steps, steps)
        assert stats["bytes_sent"] == 2 * (workers - 1) * 4 * numel // workers
        if workers > 1:  # one logged all-reduce per call, whichever buffer it wrote
            assert [event.kind for event in events] == ["allreduce"] * 4


def test_allreduce_sum_into_out_leaves_the_input_and_counts_once():
    def body(transport):
        tensor = torch.full((10,), float(transport.rank + 1))
        out = torch.empty(10)
        assert transport.allreduce_sum(tensor, out=out) is out
        assert torch.equal(tensor, torch.full((10,), float(transport.rank + 1)))
        return out, transport.traffic.rounds

    for out, rounds in local_group(3).run(body):
        assert torch.equal(out, torch.full((10,), 6.0)) and rounds == 4
