"""ZEN (``zen``): against the plain-NumPy reference (tests/zen_reference.py), its invariants at
every wire, the hash partition, the bitmap, index 0 and exact cancellation, and its state."""

import numpy as np
import pytest
import torch

import compressors
import compressors.zen  # noqa: F401 - registers "zen" where compressors/__init__ does not yet
from allreducers import ceil_log2
from allreducers.hashing import hash_owner, partition_lists
from allreducers.transports import local_group
from compressors.zen import BITMAP, COO, pack_bits, unpack_bits
from tests.ranks import heavy_tailed, mass_error, run_calls
from tests.zen_reference import owner, reference_zen

# n not divisible by most P; densities from a few entries per rank to a bitmap-sized union.
SIZES = [(37, 0.1), (101, 0.3), (1001, 0.05), (2003, 0.01)]


@pytest.mark.parametrize("workers", range(1, 13))
@pytest.mark.parametrize("numel,density", SIZES)
def test_equals_the_reference_bit_for_bit(workers, numel, density):
    """Results, residuals, index forms and bytes per rank, over three calls (the later ones
    start from the residuals the earlier left)."""
    calls, _ = run_calls("zen", workers, numel, density, calls=3, seed=workers * 31 + numel)
    for call in calls:
        acc = (call["grads"] + call["before"]).numpy()
        expected = reference_zen(acc, density)
        for result in call["results"]:
            np.testing.assert_array_equal(result.numpy(), expected["result"])
        np.testing.assert_array_equal(call["after"].numpy(), expected["residual"])
        assert [s["bytes_sent"] for s in call["stats"]] == expected["bytes"]
        union = sum(len(u) for u in expected["union"])
        bitmaps = expected["forms"].count(BITMAP)
        for stats in call["stats"]:
            assert stats["union"] == union and stats["bitmaps"] == bitmaps
            assert stats["rounds"] == (workers - 1 + ceil_log2(workers) if workers > 1 else 0)
            assert stats["nnz"] == int(np.count_nonzero(expected["result"]))


@pytest.mark.parametrize("pull_index", ["bitmap", "coo"])
@pytest.mark.parametrize("workers", [2, 3, 5, 7, 12])
def test_forced_index_forms_equal_the_reference(workers, pull_index):
    numel, density = 523, 0.04
    calls, _ = run_calls(
        "zen", workers, numel, density, calls=2, seed=workers, pull_index=pull_index
    )
    for call in calls:
        expected = reference_zen((call["grads"] + call["before"]).numpy(), density, pull_index)
        assert set(expected["forms"]) == {BITMAP if pull_index == "bitmap" else COO}
        for result in call["results"]:
            np.testing.assert_array_equal(result.numpy(), expected["result"])
        np.testing.assert_array_equal(call["after"].numpy(), expected["residual"])
        assert [s["bytes_sent"] for s in call["stats"]] == expected["bytes"]


@pytest.mark.parametrize("workers", [4, 8])
def test_auto_takes_lists_when_sparse_and_bitmaps_when_dense(workers):
    numel = 20011
    for density, form in ((0.002, COO), (0.2, BITMAP)):
        calls, _ = run_calls("zen", workers, numel, density, calls=1, seed=3)
        expected = reference_zen((calls[0]["grads"] + calls[0]["before"]).numpy(), density)
        assert expected["forms"] == [form] * workers
        assert calls[0]["stats"][0]["bitmaps"] == (workers if form == BITMAP else 0)
        np.testing.assert_array_equal(calls[0]["results"][0].numpy(), expected["result"])


def test_auto_mixes_forms_per_partition():
    """Skewed unions: the owners of a hot block get bitmaps, the others lists, in one call."""
    workers, numel, density = 4, 65536, 600 / 65536
    k = int(numel * density)
    grads = 1e-3 * heavy_tailed((1, workers, numel), 5)
    hot = torch.arange(numel)[hash_owner(torch.arange(numel), workers) == 0][: workers * (k - 10)]
    for rank in range(workers):  # each rank's top-k: k - 10 of owner 0's, 10 anywhere
        grads[0, rank, hot[rank::workers]] += 10.0
    calls, _ = run_calls("zen", workers, numel, density, calls=1, grads=grads)
    expected = reference_zen((calls[0]["grads"] + calls[0]["before"]).numpy(), density)
    assert BITMAP in expected["forms"] and COO in expected["forms"]
    np.testing.assert_array_equal(calls[0]["results"][0].numpy(), expected["result"])
    assert [s["bytes_sent"] for s in calls[0]["stats"]] == expected["bytes"]


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("workers", [1, 2, 3, 6, 11])
def test_invariants_at_every_wire(workers, wire):
    """Same bits on every rank, mass conserved, deterministic, density 1 the dense average."""
    for numel, density in ((211, 0.05), (97, 1.0)):
        runs = [
            run_calls("zen", workers, numel, density, calls=3, seed=workers, wire=wire)[0]
            for _ in range(2)
        ]
        for call, again in zip(*runs):
            first = call["results"][0]
            assert all(torch.equal(first, other) for other in call["results"])
            assert torch.equal(first, again["results"][0])
            assert torch.equal(call["after"], again["after"])
            error, scale = mass_error(call, workers)
            assert error <= 1e-5 * scale
            if density == 1.0 and wire == "fp32":
                dense = (call["grads"] + call["before"]).double().mean(0).numpy()
                np.testing.assert_allclose(first.double().numpy(), dense, rtol=1e-5, atol=1e-6)
                assert float(call["after"].abs().max()) == 0.0


def test_sixteen_bit_wires_send_fewer_bytes():
    sent = {}
    for wire in ("fp32", "fp16"):
        calls, _ = run_calls("zen", 4, 20000, 0.01, calls=1, seed=2, wire=wire)
        sent[wire] = sum(s["bytes_sent"] for s in calls[0]["stats"])
    assert sent["fp16"] < 0.65 * sent["fp32"]


@pytest.mark.parametrize("pull_index", ["auto", "bitmap", "coo"])
@pytest.mark.parametrize("workers", [2, 3])
def test_index_zero_and_an_exact_cancellation_stay_present(workers, pull_index):
    """Index 0 is an index like any other; a sum that cancels to 0.0 is still sent (every rank
    zeroes it in its residual) and the result holds 0.0 there."""
    numel, density = 64, 2 / 64
    grads = torch.zeros(1, workers, numel)
    grads[0, :, 0] = 4.0  # every rank selects index 0
    grads[0, 0, 9], grads[0, 1, 9] = 3.0, -3.0  # ranks 0 and 1 select 9, whose sum is 0.0
    grads[0, 2:, 20] = 2.0
    grads[0, :, 30:40] = 0.5  # left in the residuals
    calls, _ = run_calls("zen", workers, numel, density, calls=1, grads=grads)
    call = calls[0]
    result = call["results"][0]
    assert float(result[0]) == 4.0 and float(result[9]) == 0.0
    assert float(call["after"][:, [0, 9]].abs().max()) == 0.0
    assert float(call["after"][:, 30:40].min()) == 0.5
    expected = reference_zen((call["grads"] + call["before"]).numpy(), density, pull_index)
    assert 9 in expected["union"][int(owner([9], workers)[0])]
    np.testing.assert_array_equal(result.numpy(), expected["result"])
    stats = call["stats"][0]
    assert stats["union"] == (3 if workers == 3 else 2)
    assert stats["nnz"] == stats["union"] - 1
    error, scale = mass_error(call, workers)
    assert error <= 1e-6 * scale


def test_hash_partition_is_fixed_exhaustive_and_balanced():
    numel, workers = 100003, 8
    lists = partition_lists(numel, workers)
    everything = torch.cat(lists).long()
    assert torch.equal(everything.sort().values, torch.arange(numel))
    for r, part in enumerate(lists):
        assert torch.equal(part, part.sort().values)
        assert bool((hash_owner(part, workers) == r).all())
        assert abs(part.numel() - numel / workers) < 0.02 * numel / workers
    # The NumPy reference's hash, and a clustered block spread over every owner.
    indices = torch.arange(0, 2**31 - 1, 9973)
    np.testing.assert_array_equal(hash_owner(indices, 5).numpy(), owner(indices.numpy(), 5))
    block = torch.bincount(hash_owner(torch.arange(5000, 6000), workers), minlength=workers)
    assert int(block.min()) > 1000 / workers / 2
    assert partition_lists(numel, workers) is lists  # cached
    with pytest.raises(ValueError, match="parts"):
        hash_owner(indices, 0)


@pytest.mark.parametrize("length", [1, 7, 32, 33, 100])
def test_bitmap_round_trip(length):
    generator = torch.Generator().manual_seed(length)
    for positions in (
        torch.arange(length),
        torch.tensor([0]),
        torch.tensor([length - 1]),
        torch.randperm(length, generator=generator)[: length // 3].sort().values,
    ):
        words = pack_bits(positions, length)
        assert words.dtype == torch.int32 and words.numel() == (length + 31) // 32
        assert torch.equal(unpack_bits(words, length), positions)


@pytest.mark.parametrize("options", [{}, {"wire": "fp16", "pull_index": "bitmap"}])
def test_state_round_trip_continues_bit_for_bit(options):
    workers, numel, density = 5, 3001, 0.02
    grads = heavy_tailed((6, workers, numel), 8)

    def body(transport):
        first = compressors.create("zen", transport, numel=numel, density=density, **options)
        for call in range(3):
            first.allreduce(grads[call, transport.rank])
        state = first.state_dict()
        expected = [
            (first.allreduce(grads[c, transport.rank]), first.residual.clone()) for c in (3, 4, 5)
        ]
        second = compressors.create("zen", transport, numel=numel, density=density, **options)
        second.load_state_dict(state)
        again = [
            (second.allreduce(grads[c, transport.rank]), second.residual.clone()) for c in (3, 4, 5)
        ]
        same = all(
            torch.equal(a, b) and torch.equal(r, s) for (a, r), (b, s) in zip(expected, again)
        )
        other = compressors.create("zen", transport, numel=numel, density=0.5, **options)
        return same, other.state_mismatch(state)

    for same, mismatch in local_group(workers).run(body):
        assert same and "density" in mismatch


def test_options_are_checked():
    transport = local_group(1).rank(0)
    with pytest.raises(ValueError, match="pull_index"):
        compressors.create("zen", transport, numel=10, density=0.5, pull_index="csr")
    with pytest.raises(ValueError, match="pull_index"):
        compressors.check_options("zen", 4, pull_index="csr")
    assert compressors.option_defaults("zen")["pull_index"] == "auto"
    assert compressors.resolve("zen").conserves_mass
