"""Every registered method on CUDA tensors through the in-process group, against the same calls
on the CPU (skipped without a GPU)."""

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import local_group
from tests.ranks import heavy_tailed, measuring

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
OPTIONS = {"oktopk": dict(local_interval=2, global_interval=3, region_interval=2)}


def synchronize(method, grads, device, density):
    calls, workers, numel = grads.shape
    options = measuring(method, OPTIONS.get(method))
    measure = options.get("measure_loss", False)  # gTop-k: its lost mass, checked below

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        outputs = []
        for call in range(calls):
            before = sync.residual.cpu().clone()
            result = sync.allreduce(grads[call, transport.rank].to(device))
            if measure:
                sync.measure_lost_mass()
            outputs.append((before, result, sync.residual.cpu().clone(), dict(sync.stats)))
        return outputs

    return local_group(workers).run(body)


@pytest.mark.parametrize("method", compressors.available())
@pytest.mark.parametrize("workers", [1, 3, 4, 6])
@pytest.mark.parametrize("density", [0.01, 1.0])
def test_baseline_on_cuda_matches_cpu(method, workers, density):
    grads = heavy_tailed((4, workers, 60000), workers)
    on_gpu = synchronize(method, grads, "cuda", density)
    on_cpu = synchronize(method, grads, "cpu", density)
    for call in range(4):
        results = [rank[call][1] for rank in on_gpu]
        assert all(r.is_cuda and torch.equal(r, results[0]) for r in results), "ranks disagree"
        expected = on_cpu[0][call][1].numpy()
        assert np.array_equal(np.nonzero(results[0].cpu().numpy())[0], np.nonzero(expected)[0])
        np.testing.assert_allclose(results[0].cpu().numpy(), expected, rtol=1e-5, atol=1e-6)
        before = torch.stack([rank[call][0] for rank in on_gpu]).double()
        after = torch.stack([rank[call][2] for rank in on_gpu]).double()
        lhs = (grads[call].double() + before).sum(0)
        missing = lhs - workers * results[0].cpu().double() - after.sum(0)
        scale = float(lhs.abs().max()) + 1
        if compressors.resolve(method).conserves_mass:
            assert float(missing.abs().max()) <= 1e-5 * scale
        elif "lost_sum" in on_gpu[0][call][3]:
            assert abs(float(missing.sum()) - on_gpu[0][call][3]["lost_sum"]) <= 1e-4 * scale
        if density == 1.0:
            np.testing.assert_allclose(
                results[0].cpu().numpy(),
                (grads[call].double() + before).mean(0).numpy(),
                rtol=1e-5,
                atol=1e-5,
            )
