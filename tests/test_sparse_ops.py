"""The shared helpers of compressors.sparse_ops."""

import torch

from compressors.sparse_ops import count_nonzero, entries_at_least, is_member, put_, zero_


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


def test_count_nonzero_counts_as_torch_does():
    """NaN and inf count, zero and -0.0 do not; any shape or stride, and a tensor that requires
    grad."""
    values = torch.tensor([0.0, -0.0, 1.0, float("nan"), float("inf"), -3.0, 1e-45, 0.0])
    for tensor in (
        values,
        values.view(2, 4).t(),
        values[::3],
        torch.zeros(0),
        values.clone().requires_grad_(),
    ):
        assert count_nonzero(tensor) == int(torch.count_nonzero(tensor)), tensor
    assert count_nonzero(values) == 5
    long = torch.zeros(3 * (1 << 18) + 5)  # several chunks and a short last one
    long[::7] = 1.0
    long[-1] = float("nan")
    assert count_nonzero(long) == int(torch.count_nonzero(long))


def test_put_sets_the_listed_entries_along_the_last_dimension_as_scatter_does():
    """``put_`` (every method's result writes and residual clears): the same as torch's
    ``scatter_(-1, ...)`` for a vector, a matrix and strided views, with a tensor, a number or
    a bool; written in place into the tensor's storage (nothing else changes) and returned."""
    generator = torch.Generator().manual_seed(5)
    cases = [
        (lambda m: m[2], torch.randperm(300, generator=generator)[:40].sort().values),
        (lambda m: m, torch.randperm(300, generator=generator)[:24].view(6, 4)),
        (lambda m: m.t()[:, 1:5], torch.randint(0, 4, (300, 1), generator=generator)),
        (lambda m: m.t()[:, 1:5], torch.tensor([[0, 3]]).expand(300, 2)),
    ]
    for view, indices in cases:
        for values in (torch.randn(indices.shape, generator=generator), 0.0, -2.5):
            whole = torch.randn(6, 300, generator=generator)
            expected = whole.clone()
            view(expected).scatter_(-1, indices, values)
            tensor = view(whole)
            assert put_(tensor, indices, values) is tensor
            assert torch.equal(whole, expected)
    mask = torch.zeros(50, dtype=torch.bool)
    assert put_(mask, torch.tensor([3, 7, 49]), True).nonzero().view(-1).tolist() == [3, 7, 49]


def test_is_member_matches_python_sets_for_mixed_index_types():
    """``is_member`` (gtopk's and oktopk's residual clears): the mask of ``query`` entries found
    in the sorted set, int32 against int64 included, and empty on either side."""
    generator = torch.Generator().manual_seed(3)
    sorted_set = torch.randperm(5000, generator=generator)[:700].sort().values
    query = torch.randperm(5000, generator=generator)[:900]
    expected = [int(v) in set(sorted_set.tolist()) for v in query]
    assert 100 < sum(expected) < 900  # both outcomes occur
    for set_type, query_type in [
        (torch.int64, torch.int64),
        (torch.int32, torch.int64),
        (torch.int64, torch.int32),
    ]:
        mask = is_member(sorted_set.to(set_type), query.to(query_type))
        assert mask.dtype == torch.bool and mask.tolist() == expected
        assert (
            is_member(sorted_set.to(set_type), query[:5].to(query_type)).tolist() == expected[:5]
        )  # searches
    assert is_member(sorted_set[:0], query).tolist() == [False] * 900
    assert is_member(sorted_set, query[:0]).numel() == 0


def test_entries_at_least_keeps_the_list_entries_at_or_above_the_threshold_in_order():
    """``entries_at_least`` (the end of Ok-Topk's threshold raise and Gaussiank's correction)."""
    indices = torch.tensor([3, 8, 9, 20, 41])
    values = torch.tensor([-2.0, 0.5, 1.0, -0.99, 3.0])
    kept, kept_values = entries_at_least(indices, values, values.abs(), 1.0)
    assert kept.tolist() == [3, 9, 41] and kept_values.tolist() == [-2.0, 1.0, 3.0]
    none, no_values = entries_at_least(indices, values, values.abs(), 5.0)
    assert none.numel() == 0 and no_values.numel() == 0
