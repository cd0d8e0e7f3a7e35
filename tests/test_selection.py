"""The one selection function against a plain numpy reference (exact k, ties to the lower index)."""
import numpy as np
import pytest
import torch

from compressors import Selector


def reference_topk(x, k):
    magnitude = np.abs(x.numpy())
    order = np.lexsort((np.arange(len(magnitude)), -magnitude))  # by |x| desc, then index asc
    return np.sort(order[:k])


@pytest.mark.parametrize("n", [1, 7, 100, 5000, 40000, 300000])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
def test_topk_matches_reference(n, density):
    x = torch.from_numpy(np.random.default_rng(n).standard_t(3, n).astype(np.float32))
    k = max(1, int(n * density))
    got = Selector().topk(x, k)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), reference_topk(x, k))


@pytest.mark.parametrize("n", [50, 100000])
def test_ties_go_to_the_lower_index(n):
    x = torch.zeros(n)
    x[::3] = 1.0
    x[5] = -2.0
    k = 10
    np.testing.assert_array_equal(Selector().topk(x, k).numpy(), reference_topk(x, k))


@pytest.mark.parametrize("nonzeros", [0, 3, 500, 5000])
def test_mostly_zero_vectors_still_give_exactly_k(nonzeros):
    n, k = 200000, 1000
    x = torch.zeros(n)
    positions = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:nonzeros]
    x[positions] = torch.randn(nonzeros, generator=torch.Generator().manual_seed(2))
    got = Selector().topk(x, k)
    assert got.numel() == k and got.unique().numel() == k
    np.testing.assert_array_equal(got.numpy(), reference_topk(x, k))


def test_reused_selector_is_exact_across_sizes():
    selector = Selector()
    for n in (100000, 70000, 100000, 40000):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        np.testing.assert_array_equal(selector.topk(x, n // 50).numpy(), reference_topk(x, n // 50))


def test_k_below_one_is_rejected():
    with pytest.raises(ValueError):
        Selector().topk(torch.randn(10), 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_topk_on_cuda_selects_the_largest():
    x = torch.randn(100000, generator=torch.Generator().manual_seed(0))
    got = Selector().topk(x.cuda(), 1000)
    assert got.is_cuda
    np.testing.assert_array_equal(got.cpu().numpy(), reference_topk(x, 1000))
