"""``dense`` at the speed of the bare all-reduce: the division fused into the copy an out-of-place
all-reduce makes, then one in-place sum; ``count_nnz`` keeps the non-zero count out of the call."""

import math

import pytest
import torch

import compressors
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport
from tests.ranks import heavy_tailed


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_dense_is_the_ordered_sum_of_grad_over_p_into_any_buffer(workers):
    numel = 70_003
    grads = heavy_tailed((workers, numel), workers)
    grads[:, ::5] = 0.0  # zero on every rank: zero in the result, left out of nnz
    grads[:, 1::5] = -0.0
    expected = grads[0] / workers
    for grad in grads[1:]:
        expected += grad / workers  # the in-process all-reduce sums in rank order
    if workers in (1, 2, 4):  # dividing by a power of two is exact: the bits of sum / P
        total = grads[0].clone()
        for grad in grads[1:]:
            total += grad
        assert torch.equal((total / workers).view(torch.int32), expected.view(torch.int32))

    def body(transport):
        recorder = RecordingTransport(transport)
        sync = compressors.create("dense", recorder, numel=numel)
        grad = grads[transport.rank].clone()
        results = [
            sync.allreduce(grad),
            sync.allreduce(grad, out=torch.empty(numel)),
            sync.allreduce(grad, out=torch.empty(2 * numel)[::2]),
        ]
        assert torch.equal(grad, grads[transport.rank]), "the gradient was modified"
        results.append(sync.allreduce(grad, out=grad))
        assert results[-1] is grad
        return results, dict(sync.stats), recorder.take()

    for results, stats, events in local_group(workers).run(body):
        assert all(
            torch.equal(result.view(torch.int32), expected.view(torch.int32)) for result in results
        )
        assert stats["nnz"] == int(torch.count_nonzero(expected)) < numel
        steps = 2 * math.ceil(math.log2(workers))
        assert (stats["rounds"], stats["messages"]) == (steps, steps)
        assert stats["bytes_sent"] == 2 * (workers - 1) * 4 * numel // workers
        if workers > 1:  # one logged all-reduce per call, whichever buffer it wrote
            assert [event.kind for event in events] == ["allreduce"] * 4


@pytest.mark.parametrize("method", compressors.available())
def test_count_nnz_off_leaves_the_count_out_and_the_results_alone(method):
    """Without ``count_nnz`` the calls that would need a pass over the result (dense, warm-up
    calls, methods that do not know their non-zeros) report ``nnz`` None; the results and every
    other stat are unchanged, and methods that know their count still report it."""
    workers, numel = 3, 3000
    grads = heavy_tailed((3, workers, numel), 8)

    def body(transport, count):
        sync = compressors.create(method, transport, numel=numel, density=0.02, dense_warmup=1)
        sync.count_nnz = count
        out = []
        for call in range(3):
            result = sync.allreduce(grads[call, transport.rank])
            out.append((result, dict(sync.stats), int(torch.count_nonzero(result))))
        return out

    counted, uncounted = local_group(workers).run(body, True), local_group(workers).run(body, False)
    for rank in range(workers):
        for call in range(3):
            (result, stats, nnz), (same, other, _) = counted[rank][call], uncounted[rank][call]
            assert torch.equal(result, same) and stats["nnz"] == nnz
            assert {k: v for k, v in stats.items() if k not in ("nnz", "seconds")} == {
                k: v for k, v in other.items() if k not in ("nnz", "seconds")
            }
            assert other["nnz"] in (None, nnz)
            if call == 0 or method == "dense":
                assert other["nnz"] is None, "a pass over the result was made"


def test_allreduce_sum_into_out_leaves_the_input_and_counts_once():
    def body(transport):
        tensor = torch.full((10,), float(transport.rank + 1))
        out = torch.empty(10)
        assert transport.allreduce_sum(tensor, out=out) is out
        assert torch.equal(tensor, torch.full((10,), float(transport.rank + 1)))
        return out, transport.traffic.rounds

    for out, rounds in local_group(3).run(body):
        assert torch.equal(out, torch.full((10,), 6.0)) and rounds == 4
