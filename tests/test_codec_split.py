"""The wire split by kind, ZEN's partitions on the wire, the one check of a choice, the joined
all-gather, and the methods the pipeline and synchronizers offer their callers."""

import pytest
import torch

import allreducers
import compressors
from allreducers import (
    WIRES,
    Codec,
    PartitionCodec,
    allgather_joined,
    allgather_lists,
    bruck_allgather_schedule,
    check_choice,
    check_wire,
    codec,
)
from allreducers.hashing import partition_lists
from allreducers.transports import local_group
from allreducers.wire import BITMAP, COO, Bf16Codec, Fp16Codec, Fp32Codec, bitmap_padded
from compressors.pipeline import BucketPipeline
from compressors.spardl import check_residuals, check_srs, check_teams
from compressors.teams import check_layout

pytestmark = pytest.mark.timeout(120)


# The codec, one class per wire kind ------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "kind", "compact", "dtype"),
    [
        ("fp32", Fp32Codec, False, torch.int32),
        ("fp16", Fp16Codec, True, torch.uint8),
        ("bf16", Bf16Codec, True, torch.uint8),
    ],
)
def test_each_wire_has_its_codec_class(wire, kind, compact, dtype):
    assert type(codec(wire)) is kind and isinstance(codec(wire), Codec)
    assert type(Codec(wire)) is kind and Codec(wire) is not codec(wire)
    assert type(kind()) is kind and kind().wire == wire
    assert codec(wire).compact is compact and codec(wire).recv_dtype == dtype
    with pytest.raises(ValueError, match="is not the codec of"):
        kind("fp32" if wire != "fp32" else "fp16")


def test_the_engine_has_no_pack_or_unpack():
    assert not hasattr(allreducers, "pack") and not hasattr(allreducers, "unpack")
    assert "pack" not in allreducers.__all__ and "unpack" not in allreducers.__all__


@pytest.mark.parametrize("wire", WIRES)
def test_values_bytes_are_the_bytes_of_encode_values(wire):
    coder = codec(wire)
    for sizes in ([0], [5], [3, 0, 70000]):
        pieces = [torch.randn(size) for size in sizes]
        message = coder.encode_values(pieces)
        assert message.numel() * message.element_size() == coder.values_bytes(sizes)
        joined = coder.decode_values_joined(
            [coder.encode_values([piece]) for piece in pieces], sizes
        )
        assert torch.equal(joined, torch.cat([coder.quantize(piece) for piece in pieces]))
        with pytest.raises(RuntimeError, match="malformed"):
            coder.decode_values_joined([coder.encode_values([pieces[0]])], [sizes[0] + 1])


# ZEN's partitions ------------------------------------------------------------------------------


def partitions(numel, owners, density, seed):
    """Per owner (L_r, U_r ascending, values) of a random selection of about ``density``."""
    generator = torch.Generator().manual_seed(seed)
    parts = []
    for owned in partition_lists(numel, owners):
        chosen = torch.rand(owned.numel(), generator=generator) < density
        parts.append((owned, owned[chosen], torch.randn(int(chosen.sum()), generator=generator)))
    return parts


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("index", ["auto", "bitmap", "coo"])
def test_partitions_round_trip_in_either_form(wire, index):
    coder = PartitionCodec(codec(wire), index)
    for density in (0.0, 0.01, 0.5, 1.0):
        parts = partitions(5003, 4, density, seed=int(density * 100))
        encoded = [coder.encode(owned, union, sums) for owned, union, sums in parts]
        for part, (_, union, _) in zip(encoded, parts):
            assert part.count == union.numel() and part.body.dtype == torch.int32
            assert part.body.numel() == (part.length + 3) // 4
            if index != "auto":
                assert part.form == (BITMAP if index == "bitmap" else COO)
        message = coder.join(encoded, torch.device("cpu"))
        assert message.dtype == coder.recv_dtype
        received = dict(enumerate(coder.split(message, len(encoded))))
        for got, sent in zip(received.values(), encoded):
            assert got[:3] == sent[:3] and torch.equal(got.body, sent.body)
        lists = {o: p for o, p in received.items() if p.form == COO}
        bitmaps = {o: p for o, p in received.items() if p.form == BITMAP}
        expected = {}
        if lists:
            expected[COO] = coder.decode_lists(lists)
        if bitmaps:
            padded = torch.cat([bitmap_padded(parts[o][0]) for o in bitmaps])
            sizes = [parts[o][0].numel() for o in bitmaps]
            expected[BITMAP] = coder.decode_bitmaps(bitmaps, sizes, padded)
        for form, chosen in ((COO, lists), (BITMAP, bitmaps)):
            if not chosen:
                continue
            indices, values = expected[form]
            assert torch.equal(indices.long(), torch.cat([parts[o][1] for o in chosen]).long())
            want = torch.cat([codec(wire).quantize(parts[o][2]) for o in chosen])
            assert torch.equal(values, want)
        with pytest.raises(RuntimeError, match="malformed"):
            coder.split(torch.cat([message, message[-1:]]), len(encoded))  # a word too many


def test_auto_takes_the_form_of_fewer_bytes():
    for wire in WIRES:
        auto, listed, bitmap = (PartitionCodec(codec(wire), i) for i in ("auto", "coo", "bitmap"))
        for density in (0.001, 0.02, 0.05, 0.3):
            ((owned, union, sums),) = partitions(20011, 1, density, seed=7)
            sizes = {
                form: coder.encode(owned, union, sums).length
                for form, coder in ((COO, listed), (BITMAP, bitmap))
            }
            assert auto.encode(owned, union, sums).form == (
                BITMAP if sizes[BITMAP] < sizes[COO] else COO
            )


# One check of a choice -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda: check_wire("fp8"), "wire='fp8' is not a wire format; valid: fp32, fp16, bf16"),
        (lambda: check_wire(16), "wire=16 is not a wire format; valid: fp32, fp16, bf16"),
        (lambda: check_layout("ring"), "layout='ring' is not a team layout; valid: block, strided"),
        (
            lambda: check_srs(None),
            "srs=None is not a Spar-Reduce-Scatter execution; valid: rounds, blocks",
        ),
        (
            lambda: check_residuals("none"),
            "residuals='none' is not a residual rule; valid: global, local",
        ),
        (
            lambda: check_teams(1, "ring", 4),
            "sag='ring' is not a Spar-All-Gather variant; valid: bruck, recursive",
        ),
        (
            lambda: compressors.check_options("spardl", 4, sag="ring"),
            "sag='ring' is invalid; valid: bruck, recursive",
        ),
        (
            lambda: compressors.create(
                "zen", local_group(1).rank(0), numel=10, density=0.5, pull_index="csr"
            ),
            "pull_index='csr' is invalid; valid: auto, bitmap, coo",
        ),
        (
            lambda: compressors.check_options("zen", 4, pull_index=["coo"]),
            "pull_index=['coo'] is invalid; valid: auto, bitmap, coo",
        ),
    ],
)
def test_every_choice_is_checked_with_its_message(check, message):
    with pytest.raises(ValueError) as raised:
        check()
    assert str(raised.value) == message


def test_check_choice_returns_the_value():
    assert check_choice("x", "b", ("a", "b")) == "b"
    assert check_choice("x", "a", {"a": 1}) == "a"
    with pytest.raises(ValueError, match=r"^x='c' is odd; valid: a, b$"):
        check_choice("x", "c", ("a", "b"), "odd")


# The joined all-gather -------------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("workers", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("fixed", [False, True])
def test_allgather_joined_is_the_lists_in_item_order(wire, workers, fixed):
    def body(transport):
        rank, steps = transport.rank, bruck_allgather_schedule(transport.rank, range(workers))
        size = 4 if fixed else rank % 3 + (rank == 1) * 70
        generator = torch.Generator().manual_seed(rank)
        own = (
            torch.randperm(1000, generator=generator)[:size].sort().values.int(),
            codec(wire).quantize(torch.randn(size, generator=generator)),
        )
        fixed_size = size if fixed else None
        span = 1000 if fixed else None  # fixed lists at a 16-bit wire travel as rows
        joined = allgather_joined(transport, steps, own, fixed_size, wire=wire, span=span)
        held = allgather_lists(transport, steps, rank, own, fixed_size, wire=wire)
        return joined, [held[item] for item in range(workers)]

    for (indices, values, sizes), lists in local_group(workers).run(body):
        assert sizes == [part.numel() for part, _ in lists]
        assert indices.dtype == torch.int32 and values.dtype == torch.float32
        assert torch.equal(indices, torch.cat([part.int() for part, _ in lists]))
        assert torch.equal(values, torch.cat([part for _, part in lists]))


# What the synchronizers and the pipeline offer -------------------------------------------------


def test_a_synchronizer_offers_its_traffic_and_a_sum():
    def body(transport):
        sync = compressors.create("topk", transport, numel=100, density=0.1)
        sync.allreduce(torch.ones(100))
        counted = sync.traffic_counts()
        keys = ("bytes_sent", "messages", "rounds", "host_syncs")
        same = counted == {key: sync.stats[key] for key in keys}
        sync.reset_traffic()
        zero = sync.traffic_counts() == dict.fromkeys(keys, 0)
        total = sync.allreduce_sum_(torch.full((3,), float(transport.rank)))
        return same, zero, total.tolist(), sync.traffic_counts()["bytes_sent"] > 0

    for same, zero, total, counted in local_group(3).run(body):
        assert same and zero and total == [3.0, 3.0, 3.0] and counted


def test_the_pipeline_offers_its_buckets_residuals_and_state():
    def body(transport):
        pipeline = BucketPipeline(transport, "topk", 0.1)
        grad = torch.randn(50, generator=torch.Generator().manual_seed(transport.rank))
        pipeline.synchronize(["a", "b"], [20, 30], grad)
        synchronizers = pipeline.synchronizers()
        sync = synchronizers["a,b"]
        residual = pipeline.residual("b")
        state = pipeline.state_dict()
        same = torch.equal(residual, sync.residual[20:]) and torch.equal(
            state["a,b"]["state"]["residual"], sync.residual
        )
        pipeline.load_state_dict({})
        gone = pipeline.residual("a") is None and pipeline.synchronizers() == {}
        return list(synchronizers), same, gone, (pipeline.rank, pipeline.size)

    for rank, (keys, same, gone, where) in enumerate(local_group(2).run(body)):
        assert keys == ["a,b"] and same and gone and where == (rank, 2)
