"""The shared helpers of compressors.sparse_ops."""
import torch

from compressors.sparse_ops import entries_at_least, is_member, zero_


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


def test_is_member_matches_python_sets_for_mixed_index_types():
    """``is_member`` (gtopk's and oktopk's residual clears): the mask of ``query`` entries found
    in the sorted set, int32 against int64 included, and empty on either side."""
    generator = torch.Generator().manual_seed(3)
    sorted_set = torch.randperm(5000, generator=generator)[:700].sort().values
    query = torch.randperm(5000, generator=generator)[:900]
    expected = [int(v) in set(sorted_set.tolist()) for v in query]
    assert 100 < sum(expected) < 900  # both outcomes occur
    for set_type, query_type in [(torch.int64, torch.int64), (torch.int32, torch.int64), (torch.int64, torch.int32)]:
        mask = is_member(sorted_set.to(set_type), query.to(query_type))
        assert mask.dtype == torch.bool and mask.tolist() == expected
        assert is_member(sorted_set.to(set_type), query[:5].to(query_type)).tolist() == expected[:5]  # searches
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
