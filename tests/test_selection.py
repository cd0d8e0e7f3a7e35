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


@pytest.mark.parametrize(
    "rows,n", [(1, 300000), (3, 40000), (5, 7), (4, 1000), (2, 600000), (9, 70000)]
)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3])
def test_topk_rows_selects_each_row_exactly(threads, rows, n, density):
    x = torch.from_numpy(
        np.random.default_rng(rows * n).standard_t(3, (rows, n)).astype(np.float32)
    )
    x[0] *= 100.0  # rows of very different scales get their own thresholds
    k = max(1, int(n * density))
    got = Selector().topk_rows(x, k)
    assert got.shape == (rows, k) and got.dtype == torch.int64
    for row in range(rows):
        np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], k))


def test_topk_rows_mixes_regular_sparse_and_tied_rows(threads):
    n, k = 50000, 500
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(3))
    x[1] = 0.0
    x[1, ::20000] = 5.0  # 3 non-zeros: the rest are the lowest-index zeros
    x[2] = 1.0
    x[2, 777] = -3.0  # all ties but one
    x[3, 1000:3000] = 0.0
    got = Selector().topk_rows(x, k)
    for row in range(4):
        np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], k))


def test_topk_rows_recovers_when_the_sample_overestimates(threads):
    """Large values exactly at the sample positions make the estimated threshold too high: those
    rows have fewer candidates than k, get a second pass (only they), and come out exact; row 2
    has non-zeros only there (fewer than k), so its lowest-index zeros complete it."""
    n, k = 40000, 2000
    selector = Selector()
    selector.topk_rows(torch.randn(3, n), k)  # fixes the sample positions for this length
    sample = torch.from_numpy(selector._samples[n])
    x = torch.rand(3, n)
    x[1, sample] = 10.0
    x[2] = 0.0
    x[2, sample] = 10.0
    passes = spy_on_passes(selector)
    got = selector.topk_rows(x, k)
    assert [rows.tolist() for rows in passes] == [x.tolist(), x[1:2].tolist(), x[2:3].tolist()]
    for row in range(3):
        np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], k))


def test_rows_with_few_non_zeros_need_no_second_pass(threads):
    """A mostly-zero row's threshold is "non-zero" already: its missing entries are its
    lowest-index zeros, with no second pass over any row (one used to cost 100x a normal call)."""
    n, k = 200000, 2000
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(5))
    x[2] = 0.0
    x[2, ::1000] = -1.0
    selector = Selector()
    passes = spy_on_passes(selector)
    got = selector.topk_rows(x, k)
    assert len(passes) == 1
    for row in range(4):
        np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], k))


def spy_on_passes(selector):
    """Make ``selector`` log the matrix of every candidate pass it runs; returns the log."""
    passes = []
    candidates = selector._candidates
    selector._candidates = lambda rows, *rest: (
        passes.append(rows.clone()) or candidates(rows, *rest)
    )
    return passes


def test_topk_rows_keeps_whole_rows_when_k_covers_them():
    got = Selector().topk_rows(torch.randn(3, 5), 9)
    assert torch.equal(got, torch.arange(5).repeat(3, 1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("k", [100, 50_000])  # also when k covers the row and nothing is selected
def test_non_finite_values_are_a_clear_error(bad, k):
    x = torch.randn(50_000)
    x[::7] = bad  # a diverged gradient: the threshold sample meets them
    with pytest.raises(ValueError, match="NaN or inf"):
        Selector().topk(x, k)


@pytest.mark.parametrize(
    "shape,pad",
    [
        ((1, 300000), 0),
        ((4, 50000), 0),
        ((4, 50000), 3 * 50000 + 17),
        ((3, 7), 5),
        ((2, 600000), 1),
    ],
)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
def test_take_with_an_addend_takes_the_top_k_of_the_sum_out(threads, shape, pad, density):
    """``take`` adds ``addend`` into the first entries of the rows (all but ``pad`` of them), then
    takes each row's top-k of the sum out: the same columns as the reference, their values bit
    for bit, and zeros left behind."""
    rows, n = shape
    rng = np.random.default_rng(rows * n + pad)
    x = torch.from_numpy(rng.standard_t(3, shape).astype(np.float32))
    addend = torch.from_numpy(rng.standard_t(3, rows * n - pad).astype(np.float32))
    total = x.clone().view(-1)
    total[: addend.numel()] += addend
    total = total.view(shape)
    k = max(1, int(n * density))
    columns, values = Selector().take(x, k, addend)
    assert columns.shape == values.shape == (rows, min(k, n))
    expected = total.clone()
    for row in range(rows):
        np.testing.assert_array_equal(columns[row].numpy(), reference_topk(total[row], k))
        assert torch.equal(values[row], total[row, columns[row]])
        expected[row, columns[row]] = 0.0
    assert torch.equal(x, expected)


def test_select_adds_but_leaves_the_top_k_in_place():
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(4))
    addend = torch.randn(60000, generator=torch.Generator().manual_seed(5))
    total = x + addend.view(3, -1)
    columns, values = Selector().select(x, 200, addend)
    assert torch.equal(x, total)
    for row in range(3):
        np.testing.assert_array_equal(columns[row].numpy(), reference_topk(total[row], 200))
        assert torch.equal(values[row], total[row, columns[row]])


def test_take_of_a_vector_returns_one_list():
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0))
    before = x.clone()
    columns, values = Selector().take(x, 100)
    np.testing.assert_array_equal(columns.numpy(), reference_topk(before, 100))
    assert torch.equal(values, before[columns]) and int(torch.count_nonzero(x[columns])) == 0


def test_take_keeps_signs_and_zeros_of_mostly_zero_rows(threads):
    """The refill paths (an estimate too high, fewer than k non-zeros) return the true values
    too, negative zeros included."""
    n, k = 40000, 2000
    selector = Selector()
    selector.topk_rows(torch.randn(2, n), k)  # fixes the sample positions
    sample = torch.from_numpy(selector._samples[n])
    x = -torch.rand(2, n)
    x[0, sample] = -10.0  # estimate too high: a second pass
    x[1] = -0.0
    x[1, ::100] = -1.0  # 400 non-zeros: 1600 negative zeros complete the row
    before = x.clone()
    columns, values = selector.take(x, k)
    for row in range(2):
        np.testing.assert_array_equal(columns[row].numpy(), reference_topk(before[row], k))
        assert torch.equal(values[row], before[row, columns[row]])
        assert torch.equal(torch.signbit(values[row]), torch.signbit(before[row, columns[row]]))


def test_take_refuses_an_addend_for_rows_it_cannot_add_into():
    with pytest.raises(ValueError, match="contiguous"):
        Selector().take(torch.randn(8, 100).t(), 5, torch.randn(10))


def test_a_sum_holding_nan_is_a_clear_error():
    x = torch.randn(50_000)
    addend = torch.zeros(50_000)
    addend[::7] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        Selector().take(x, 100, addend)


@pytest.mark.parametrize("short", [0, 1234])
def test_at_least_adds_then_returns_every_entry_at_or_above_the_threshold(threads, short):
    x = torch.from_numpy(np.random.default_rng(short).standard_t(3, 300000).astype(np.float32))
    addend = torch.from_numpy(
        np.random.default_rng(9).standard_t(3, 300000 - short).astype(np.float32)
    )
    total = x.clone()
    total[: addend.numel()] += addend
    threshold = float(total.abs().kthvalue(300000 - 3000).values)
    indices, values = Selector().at_least(x, threshold, addend)
    assert torch.equal(x, total)
    expected = torch.nonzero(total.abs() >= threshold).squeeze(1)
    assert indices.dtype == torch.int64 and torch.equal(indices, expected)
    assert torch.equal(values, total[expected])


def heavy_rows(rows, n, seed, scale=1.0):
    """Heavy-tailed rows of independent draws, times ``scale`` (one call's residual + gradient)."""
    return torch.from_numpy(
        np.random.default_rng(seed).standard_t(3, (rows, n)).astype(np.float32) * scale
    )


@pytest.mark.parametrize("rows,n,k", [(1, 300000, 3000), (8, 60000, 600), (3, 7, 2)])
@pytest.mark.parametrize("k_steps", [[0], [0, 7, -5, 30, -30, 1, 0]], ids=["fixed-k", "changing-k"])
def test_a_key_keeps_selections_exact_while_the_values_drift(threads, rows, n, k, k_steps):
    """Call after call under one key, the values shrink, grow, and some rows empty out, and k
    may change (as Spar-All-Gather's h does): every selection still equals the reference,
    whether the remembered thresholds hit or miss."""
    selector = Selector()
    for call, scale in enumerate([1.0, 1.0, 0.5, 0.99, 3.0, 1e-3, 1.0]):
        x = heavy_rows(rows, n, call, scale)
        if call == 4:
            x[-1] = 0.0
            x[-1, :: n // 3 + 1] = 1.0  # fewer than k non-zeros: completed with zeros
        now = max(1, k + k_steps[call % len(k_steps)] * k // 100)
        got = selector.topk_rows(x, now, key="grad")
        for row in range(rows):
            np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], now))


def test_a_key_lets_fewer_candidates_through_from_the_second_call(threads):
    """From the second call on the remembered thresholds replace the sample's (no estimate is
    taken) and let far fewer candidates through on similar values, also for another k (the
    level carried along its slope); without a key, or for another shape, the sample's estimate
    is used."""
    rows, n, k = 16, 60000, 600
    selector = Selector()
    first = selector.scan(heavy_rows(rows, n, 0), k, key="grad")
    selector.pick(heavy_rows(rows, n, 0), k, first)
    estimates = []
    selector._estimate = lambda *args: estimates.append(1) or Selector._estimate(selector, *args)
    for other_k in (k, 690, 520):
        second = selector.scan(heavy_rows(rows, n, 1), other_k, key="grad")
        assert first.hinted.sum() == 0 and second.hinted.all() and not estimates
        assert (
            second.sizes.min() >= other_k
            and second.sizes.mean() < 0.7 * first.sizes.mean() * other_k / k
        )
    assert not selector.scan(heavy_rows(rows, n, 1), k).hinted.any()
    assert not selector.scan(heavy_rows(rows + 1, n, 1), k, key="grad").hinted.any()
    assert len(estimates) == 2


def test_a_remembered_threshold_that_misses_rescans_that_row_and_widens_its_margin():
    """Row 1 shrinks by half: its remembered threshold lets fewer than k through, so that row alone
    is scanned again from its sample's estimate, and its margin doubles; row 0's narrows."""
    rows, n, k = 2, 100000, 1000
    selector = Selector()
    for call in range(3):
        selector.topk_rows(heavy_rows(rows, n, call), k, key="grad")
    before = selector._memory["grad"].margins.copy()
    x = heavy_rows(rows, n, 9)
    x[1] *= 0.5
    passes, limits = [], []
    candidates = selector._candidates
    selector._candidates = lambda rows, limit, *rest: (
        passes.append(rows.clone()),
        limits.append(limit.copy()),
        candidates(rows, limit, *rest),
    )[-1]
    got = selector.topk_rows(x, k, key="grad")
    assert [p.shape[0] for p in passes] == [2, 1] and torch.equal(passes[1], x[1:2])
    assert (
        0.1 < limits[1][0] < limits[0][1]
    )  # the estimate: neither "all non-zeros" (1e-45) nor the hint
    after = selector._memory["grad"].margins
    np.testing.assert_allclose(after, [before[0] * 0.9, before[1] * 2])
    for row in range(rows):
        np.testing.assert_array_equal(got[row].numpy(), reference_topk(x[row], k))


def test_a_key_with_an_addend_takes_the_top_k_of_each_sum_out(threads):
    """``take`` under a key, as the baselines call it: residual + gradient each call."""
    rows, n, k = 4, 50000, 500
    selector = Selector()
    residual = heavy_rows(rows, n, 100)
    for call in range(4):
        grad = heavy_rows(rows, n, call).view(-1)
        expected = residual + grad.view(rows, n)
        columns, values = selector.take(residual, k, addend=grad, key=("take", 0))
        for row in range(rows):
            np.testing.assert_array_equal(columns[row].numpy(), reference_topk(expected[row], k))
            assert torch.equal(values[row], expected[row, columns[row]])
        expected.scatter_(1, columns, 0.0)
        assert torch.equal(residual, expected)


def test_inf_among_the_chosen_is_a_clear_error_under_a_key():
    """A remembered threshold takes no sample to meet inf: the chosen values are checked."""
    selector = Selector()
    selector.topk(heavy_rows(1, 50000, 0)[0], 100, key="grad")
    x = heavy_rows(1, 50000, 1)[0]
    x[::7] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        selector.topk(x, 100, key="grad")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("keyed", [False, True])
def test_one_non_finite_value_anywhere_is_a_clear_error(threads, bad, keyed):
    """One NaN far below the threshold's reach of the sample, in a plain or keyed selection, in
    the values or the addend, and in a threshold pass: an error, never a silently dropped entry."""
    for place in (0, 77_777, 199_999):
        selector = Selector()
        x = heavy_rows(1, 200_000, 0)[0]
        if keyed:
            selector.topk(x.clone(), 500, key="grad")
        bad_x, addend = x.clone(), torch.zeros_like(x)
        bad_x[place] = bad
        addend[place] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            selector.topk(bad_x, 500, key="grad" if keyed else None)
        with pytest.raises(ValueError, match="NaN or inf"):
            selector.select(x.clone(), 500, addend=addend, key="grad" if keyed else None)
        with pytest.raises(ValueError, match="NaN or inf"):
            selector.at_least(bad_x, 1.0)


def test_the_memory_keeps_the_most_recently_used_keys():
    """A new key per call does not grow the memory without bound: the least recently used key
    goes, while one in use every call stays remembered (and so hinted)."""
    selector = Selector()
    x = heavy_rows(1, 5000, 0)[0]
    for call in range(200):
        assert selector.scan(x.view(1, -1), 50, key="grad").hinted.all() == (call > 0)
        selector.topk(x, 50, key="grad")
        selector.topk(x, 50, key=("once", call))
    assert len(selector._memory) == 64 and ("once", 199) in selector._memory
    assert ("once", 135) not in selector._memory
