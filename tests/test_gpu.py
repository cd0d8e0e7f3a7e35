"""CUDA tensors through the same schedules (skipped without a GPU)."""

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.sparse_ops import put_
from tests.ranks import heavy_tailed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def synchronize(method, grads, device, **options):
    workers, numel = grads.shape

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, **options)
        outputs = []
        for _ in range(2):
            before = sync.residual.clone()
            result = sync.allreduce(grads[transport.rank].to(device))
            outputs.append((before.cpu(), result, sync.residual.cpu().clone()))
        return outputs

    return local_group(workers).run(body)


@pytest.mark.parametrize("workers,teams", [(1, 1), (4, 1), (6, 1), (6, 2), (8, 4)])
@pytest.mark.parametrize("density", [0.01, 1.0])
def test_spardl_on_cuda_matches_cpu_and_conserves_mass(workers, teams, density):
    grads = heavy_tailed((workers, 50000), workers)
    on_gpu = synchronize("spardl", grads, "cuda", density=density, teams=teams)
    on_cpu = synchronize("spardl", grads, "cpu", density=density, teams=teams)
    for call in range(2):
        results = [rank[call][1] for rank in on_gpu]
        assert all(r.is_cuda and torch.equal(r, results[0]) for r in results)
        np.testing.assert_allclose(
            results[0].cpu().numpy(), on_cpu[0][call][1].numpy(), rtol=1e-5, atol=1e-6
        )
        before = torch.stack([rank[call][0] for rank in on_gpu]).double()
        after = torch.stack([rank[call][2] for rank in on_gpu]).double()
        lhs = (grads.double() + before).sum(0)
        rhs = workers * results[0].cpu().double() + after.sum(0)
        assert float((lhs - rhs).abs().max()) <= 1e-5 * (float(lhs.abs().max()) + 1)


@pytest.mark.parametrize(
    "options",
    [
        dict(teams=2, wire="fp16"),
        dict(teams=4, sag="recursive"),
        dict(teams=4, sag="recursive", wire="bf16"),
    ],
)
def test_spar_all_gather_on_cuda_matches_cpu_with_exact_zeros(options):
    """Fixed-capacity unions on a GPU: zeros tie with the padding, which must not be kept."""
    workers = 8
    grads = heavy_tailed((workers, 50000), workers)
    grads[:, ::3] = 0.0  # many exact zeros: blocks with fewer non-zeros than they keep
    on_gpu = synchronize("spardl", grads, "cuda", density=0.8, **options)
    on_cpu = synchronize("spardl", grads, "cpu", density=0.8, **options)
    for call in range(2):
        results = [rank[call][1] for rank in on_gpu]
        assert all(torch.equal(r, results[0]) for r in results)
        np.testing.assert_allclose(
            results[0].cpu().numpy(), on_cpu[0][call][1].numpy(), rtol=1e-5, atol=1e-6
        )
        before = torch.stack([rank[call][0] for rank in on_gpu]).double()
        after = torch.stack([rank[call][2] for rank in on_gpu]).double()
        lhs = (grads.double() + before).sum(0)
        rhs = workers * results[0].cpu().double() + after.sum(0)
        assert float((lhs - rhs).abs().max()) <= 1e-5 * (float(lhs.abs().max()) + 1)


def test_dense_on_cuda():
    grads = heavy_tailed((3, 1000), 1)
    results = synchronize("dense", grads, "cuda", density=1.0)
    np.testing.assert_allclose(
        results[0][0][1].cpu().numpy(), grads.double().mean(0).numpy(), rtol=1e-5, atol=1e-6
    )


def test_put_on_cuda_matches_cpu():
    """``put_``'s CUDA path (``scatter_``) writes what its CPU path (NumPy) writes."""
    generator = torch.Generator().manual_seed(2)
    indices = torch.randperm(1000, generator=generator)[:64].view(4, 16)
    for values in (torch.randn(4, 16, generator=generator), 0.0):
        on_cpu = torch.randn(4, 1000, generator=generator)
        on_gpu = put_(
            on_cpu.cuda(),
            indices.cuda(),
            values.cuda() if isinstance(values, torch.Tensor) else values,
        )
        assert torch.equal(on_gpu.cpu(), put_(on_cpu, indices, values))
