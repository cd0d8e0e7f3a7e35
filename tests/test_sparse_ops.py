"""The shared helpers of compressors.sparse_ops."""
import torch

from compressors.sparse_ops import zero_


def test_zero_clears_exactly_the_tensor_it_is_given():
    """``sparse_ops.zero_`` (every method's result clear): memset for contiguous CPU tensors,
    torch's fill otherwise; never a byte outside the tensor."""
    whole = torch.randn(1000)
    before = whole.clone()
    assert zero_(whole[100:900]).eq(0).all()  # contiguous view at an offset: memset
    assert torch.equal(whole[:100], before[:100]) and torch.equal(whole[900:], before[900:])
    assert zero_(torch.randn(40, 30).t()).eq(0).all()  # not contiguous: torch's fill
    assert zero_(torch.randn(7, dtype=torch.float64)).eq(0).all()
    assert zero_(torch.empty(0)).numel() == 0
