"""The wire codec (allreducers/wire/) and every registered method at every wire format."""

import math

import numpy as np
import pytest
import torch

import compressors
from allreducers import WIRES, codec
from allreducers.transports import local_group
from tests.ranks import heavy_tailed, mass_error, measuring

#: Every registered method that takes the option (all of the project's own).
METHODS = [name for name in compressors.available() if "wire" in compressors.options(name)]
COMPACT = [wire for wire in WIRES if wire != "fp32"]
OPTIONS = {"oktopk": dict(local_interval=2, global_interval=3, region_interval=2)}
#: Half the distance between two neighbours of 1 in each format (relative rounding error).
HALF_ULP = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


def header_bytes(lists: int, segments: int) -> int:
    """The words before a compact message's indices: counts, exponents, segment counts."""
    return 4 * lists * (2 + segments)


# The codec ------------------------------------------------------------------------------------

INDEX_CASES = {
    "empty": [],
    "one": [7],
    "one near 2^31-1": [2**31 - 1],
    "span 65535": [10, 500, 65545],
    "span 65536": [10, 500, 65546],
    "near 2^31-1": [2**31 - 70000, 2**31 - 65536, 2**31 - 2, 2**31 - 1],
    "unsorted": [5, 2**20, 3, 2**20 + 1, 0, 70000],
}


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("case", sorted(INDEX_CASES))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_round_trip_gives_every_index_exactly(wire, case, dtype):
    indices = torch.tensor(INDEX_CASES[case], dtype=dtype)
    values = torch.linspace(-3.0, 5.0, indices.numel())
    coder = codec(wire)
    for with_counts in (False, True):
        message = coder.encode([(indices, values)], with_counts)
        assert message.dtype == coder.recv_dtype
        sizes = None if with_counts else [indices.numel()]
        ((got, got_values),) = coder.decode(message, 1, sizes)
        assert got.dtype == torch.int32
        assert got.tolist() == indices.tolist()
        assert torch.equal(got_values, coder.quantize(values))
        assert torch.equal(coder.decode_one(message)[0], got) or with_counts


@pytest.mark.parametrize("wire", COMPACT)
def test_indices_travel_as_16_bit_offsets_where_they_fit(wire):
    coder = codec(wire)
    values = torch.ones(11)
    middle = list(range(100, 1000, 100))
    fits = coder.encode([(torch.tensor([10, *middle, 65535]), values)], False, span=65536)
    assert fits.numel() == header_bytes(1, 0) + 11 * (2 + 2)  # a span of 2^16: no counts
    apart = coder.encode([(torch.tensor([10, *middle, 65545]), values)], False, span=65546)
    assert apart.numel() == header_bytes(1, 2) + 11 * (2 + 2)  # two segments
    # for three entries int32 indices are shorter than the segment counts
    three = coder.encode([(torch.tensor([10, 500, 65545]), values[:3])], False, span=65546)
    assert three.numel() == header_bytes(1, 0) + 3 * (4 + 2)
    # without a span (lists in any order) indices travel as int32
    unsorted = coder.encode([(torch.tensor([65535, *middle, 10]), values)], False)
    assert unsorted.numel() == header_bytes(1, 0) + 11 * (4 + 2)
    # one count per 65,536-wide segment of the span: a sorted list over 40 segments
    many = torch.arange(0, 40 * 65536, 97)
    message = coder.encode([(many, torch.ones(many.numel()))], False, span=40 * 65536)
    assert message.numel() == header_bytes(1, 40) + many.numel() * 4
    assert coder.decode_one(message, span=40 * 65536)[0].tolist() == many.tolist()


def test_fp32_keeps_the_int32_layout_bit_for_bit():
    coder = codec("fp32")
    lists = [(torch.tensor([1, 5]), torch.tensor([0.5, -2.0])), (torch.tensor([3]), torch.ones(1))]
    message = coder.encode(lists, with_counts=True)
    assert message.dtype == torch.int32
    assert message[:5].tolist() == [2, 1, 1, 5, 3]
    assert message[5:].view(torch.float32).tolist() == [0.5, -2.0, 1.0]
    bare = coder.encode(lists, with_counts=False)
    assert torch.equal(bare, message[2:])
    assert torch.equal(coder.encode_values([torch.ones(2)]).view(torch.float32), torch.ones(2))


def test_several_lists_keep_their_sizes_and_exponents():
    coder = codec("fp16")
    lists = [
        (torch.tensor([0, 9]), torch.tensor([1e6, -3.0])),
        (torch.tensor([], dtype=torch.int64), torch.empty(0)),
        (torch.tensor([4, 2**30]), torch.tensor([1e-6, 2e-6])),
    ]
    message = coder.encode(lists, with_counts=False)
    decoded = coder.decode(message, 3, [2, 0, 2])
    for (indices, values), (got, got_values) in zip(lists, decoded):
        assert got.tolist() == indices.tolist()
        assert torch.equal(got_values, coder.quantize(values))
    # the small list keeps its precision although the first is large
    assert abs(float(decoded[2][1][0]) - 1e-6) <= 1e-6 * HALF_ULP["fp16"]


def within_half_an_ulp(wire, values, decoded):
    """|decoded - values| <= half an ulp of the format, at the list's scale for fp16."""
    exponent = codec(wire).exponent(values)
    scaled = values.double().abs() * 2.0**-exponent
    if wire == "fp16":  # below 2^-14 (scaled) fp16 is subnormal: spacing 2^-24
        ulp = torch.where(scaled >= 2.0**-14, scaled.log2().floor().exp2() * 2.0**-10, 2.0**-24)
    else:
        ulp = scaled.log2().floor().exp2() * 2.0**-7
    bound = ulp / 2 * 2.0**exponent
    return bool(((decoded.double() - values.double()).abs() <= bound).all())


@pytest.mark.parametrize("wire", COMPACT)
@pytest.mark.parametrize("magnitude", [1e-30, 1e-4, 1.0, 6e4, 1e6, 3e38])
def test_value_error_is_at_most_half_an_ulp(wire, magnitude):
    values = heavy_tailed(4001, 3) * magnitude / 10
    values = values.clamp(-3.3e38, 3.3e38)
    coder = codec(wire)
    decoded = coder.quantize(values)
    assert bool(torch.isfinite(decoded).all())
    nonzero = values != 0
    assert within_half_an_ulp(wire, values[nonzero], decoded[nonzero])
    assert torch.equal(coder.quantize(decoded), decoded), "quantizing twice changes bits"
    assert torch.equal(coder.quantize(decoded[::7]), decoded[::7]), "a sub-list changes bits"
    ((_, got),) = coder.decode(coder.encode([(torch.arange(4001), values)], False), 1)
    assert torch.equal(got, decoded)


def test_fp16_scales_a_message_beyond_its_range_instead_of_sending_inf():
    coder = codec("fp16")
    values = torch.tensor([70000.0, -1e20, 1.0])
    assert coder.exponent(values) > 0
    decoded = coder.quantize(values)
    assert bool(torch.isfinite(decoded).all())
    assert abs(float(decoded[1]) + 1e20) <= 1e20 * HALF_ULP["fp16"]
    assert coder.exponent(torch.tensor([65504.0])) == 0
    assert coder.exponent(torch.tensor([65520.0])) == 1


@pytest.mark.parametrize("wire", COMPACT)
def test_non_finite_values_fail_with_one_clear_message(wire):
    with pytest.raises(ValueError, match="NaN or inf"):
        codec(wire).quantize(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="NaN or inf"):
        codec(wire).quantize(torch.tensor([float("inf")]))


def test_bf16_overflow_fails_naming_the_wire():
    with pytest.raises(ValueError, match="wire='bf16'"):
        codec("bf16").quantize(torch.tensor([3.4028235e38]))


@pytest.mark.parametrize("wire", WIRES)
def test_dense_values_round_trip(wire):
    coder = codec(wire)
    pieces = [heavy_tailed(300, 1), torch.empty(0), heavy_tailed(5, 2) * 1e5]
    message = coder.encode_values(pieces)
    assert message.dtype == coder.recv_dtype
    decoded = coder.decode_values(message, [300, 0, 5])
    for piece, got in zip(pieces, decoded):
        assert torch.equal(got, coder.quantize(piece))
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode_values(message, [300, 0, 6])


@pytest.mark.parametrize("wire", WIRES)
def test_malformed_messages_are_refused(wire):
    coder = codec(wire)
    message = coder.encode([(torch.tensor([1, 2]), torch.ones(2))], with_counts=False)
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode(message, 1, [3])
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode(message[:-2], 1, [2])


def test_an_unknown_wire_is_refused_everywhere():
    with pytest.raises(ValueError, match="valid: fp32, fp16, bf16"):
        codec("fp8")
    for method in METHODS:
        assert "wire" in compressors.options(method)
        assert compressors.option_defaults(method)["wire"] == "fp32"
        with pytest.raises(ValueError, match="wire='int8' is not a wire format"):
            compressors.check_options(method, 4, wire="int8")
        with pytest.raises(ValueError, match="not a wire format"):
            compressors.create(method, local_group(1).rank(0), numel=10, wire="half")


# Every method at every wire -------------------------------------------------------------------


def run(method, workers, numel, density, calls, seed, device="cpu", **options):
    """Per call: gradients, residuals before and after, results and stats of every rank."""
    options = measuring(method, dict(OPTIONS.get(method, {}), **options))
    grads = heavy_tailed((calls, workers, numel), seed)

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        history = []
        for call in range(calls):
            before = sync.residual.cpu().clone()
            result = sync.allreduce(grads[call, transport.rank].to(device))
            if getattr(sync, "measure_loss", False):
                sync.measure_lost_mass()
            history.append((before, result.cpu(), sync.residual.cpu().clone(), dict(sync.stats)))
        return history

    per_rank = local_group(workers).run(body)
    return [
        {
            "grads": grads[c],
            "before": torch.stack([h[c][0] for h in per_rank]),
            "results": [h[c][1] for h in per_rank],
            "after": torch.stack([h[c][2] for h in per_rank]),
            "stats": [h[c][3] for h in per_rank],
        }
        for c in range(calls)
    ]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("wire", COMPACT)
@pytest.mark.parametrize("workers", range(1, 13))
def test_invariants_at_every_wire(method, wire, workers):
    """Same bits on every rank, deterministic, mass conserved (or exactly the loss gTop-k
    measures), density 1 within the wire's rounding of the dense average."""
    conserves = compressors.resolve(method).conserves_mass
    for numel, density in [(101, 0.05), (2003, 0.01), (257, 1.0)]:
        seed = workers * 7 + numel
        calls = run(method, workers, numel, density, 3, seed, wire=wire)
        again = run(method, workers, numel, density, 3, seed, wire=wire)
        for call, repeat in zip(calls, again):
            first = call["results"][0]
            assert all(torch.equal(first, other) for other in call["results"]), "ranks disagree"
            assert torch.equal(first, repeat["results"][0]), "not deterministic"
            assert torch.equal(call["after"], repeat["after"]), "not deterministic"
            error, scale = mass_error(call, workers)
            if conserves or workers <= 2:
                assert error <= 1e-5 * scale, f"mass not conserved: {error}"
            elif "lost_sum" in call["stats"][0]:
                missing = (
                    (call["grads"] + call["before"]).double().sum(0)
                    - workers * first.double()
                    - call["after"].double().sum(0)
                )
                lost = call["stats"][0]["lost_sum"]
                assert abs(float(missing.sum()) - lost) <= 1e-5 * scale * math.sqrt(numel)
            if workers == 1:
                assert all(s["bytes_sent"] == 0 for s in call["stats"])
            if density == 1.0:
                accumulated = call["grads"] + call["before"]
                dense = accumulated.double().mean(0)
                # every hop may round once, at the scale of the largest value it carries
                tolerance = (workers + 2) * HALF_ULP[wire] * float(accumulated.abs().sum(0).max())
                np.testing.assert_allclose(first.double().numpy(), dense.numpy(), atol=tolerance)


@pytest.mark.parametrize("method", ["spardl", "topk", "gtopk", "oktopk", "gaussiank", "topkdsa"])
@pytest.mark.parametrize("wire", COMPACT)
def test_a_16_bit_wire_sends_about_half_the_bytes(method, wire):
    sent = {}
    for each in ("fp32", wire):
        calls = run(method, 4, 200_000, 0.01, 2, 5, wire=each)
        sent[each] = sum(s["bytes_sent"] for call in calls for s in call["stats"])
    assert sent[wire] * 1.8 <= sent["fp32"], sent


@pytest.mark.parametrize("options", [dict(teams=2), dict(teams=8), dict(teams=4, sag="recursive")])
def test_spardl_s_spar_all_gather_travels_at_the_wire_too(options):
    sent = {}
    for each in ("fp32", "fp16"):
        calls = run("spardl", 8, 200_000, 0.01, 2, 5, wire=each, **options)
        sent[each] = sum(s["bytes_sent"] for call in calls for s in call["stats"])
    assert sent["fp16"] * 1.8 <= sent["fp32"], sent


@pytest.mark.parametrize("wire", COMPACT)
def test_dense_at_a_16_bit_wire_sends_half_and_keeps_the_rest(wire):
    (call,) = run("dense", 4, 100_003, 1.0, 1, 9, wire=wire)
    (plain,) = run("dense", 4, 100_003, 1.0, 1, 9)
    assert sum(s["bytes_sent"] for s in call["stats"]) * 1.95 <= sum(
        s["bytes_sent"] for s in plain["stats"]
    )
    assert float(call["after"].abs().max()) > 0.0  # the residual holds what the wire removed
    assert float(plain["after"].abs().max()) == 0.0


@pytest.mark.parametrize(
    "options", [dict(teams=2), dict(teams=4, sag="recursive"), dict(srs="blocks")]
)
@pytest.mark.parametrize("wire", COMPACT)
def test_spardl_variants_conserve_mass_at_a_16_bit_wire(options, wire):
    for workers in (4, 8):
        for call in run("spardl", workers, 3001, 0.02, 3, workers, wire=wire, **options):
            assert all(torch.equal(call["results"][0], other) for other in call["results"])
            error, scale = mass_error(call, workers)
            assert error <= 1e-5 * scale


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("wire", COMPACT)
def test_every_method_at_a_16_bit_wire_on_cuda(method, wire):
    for workers in (1, 3, 4):
        on_gpu = run(method, workers, 60000, 0.01, 3, workers, device="cuda", wire=wire)
        on_cpu = run(method, workers, 60000, 0.01, 3, workers, wire=wire)
        for call, cpu in zip(on_gpu, on_cpu):
            assert all(torch.equal(call["results"][0], r) for r in call["results"])
            error, scale = mass_error(call, workers)
            if compressors.resolve(method).conserves_mass or workers <= 2:
                assert error <= 1e-5 * scale
            expected = cpu["results"][0].numpy()
            tolerance = 1e-2 * float(np.abs(expected).max())
            np.testing.assert_allclose(call["results"][0].numpy(), expected, atol=tolerance)


@pytest.mark.parametrize("wire", COMPACT)
def test_dense_regions_longer_than_one_exponent_piece_keep_every_invariant(wire):
    """Dense messages carry one exponent per 65,536 values: dense and TopkDSA's dense gather."""
    for method, density in (("dense", 1.0), ("topkdsa", 0.3)):
        for call in run(method, 3, 300_007, density, 2, 4, wire=wire):
            assert all(torch.equal(call["results"][0], other) for other in call["results"])
            error, scale = mass_error(call, 3)
            assert error <= 1e-5 * scale


# The package: a value format per wire, one layout for both 16-bit wires ------------------------

PUBLIC_BEFORE = [
    "WIRES", "PIECE", "check_wire", "codec", "Codec", "Fp32Codec", "CompactCodec", "Fp16Codec",
    "Bf16Codec", "device_tensor", "byte_view", "PARTITION_INDEX", "COO", "BITMAP",
    "bitmap_words", "bitmap_padded", "choose_form", "pack_bits", "unpack_bits", "Partition",
    "PartitionCodec",
]  # fmt: skip


def test_every_name_the_wire_module_had_imports_from_the_package():
    import allreducers.device
    import allreducers.wire as package

    missing = [name for name in PUBLIC_BEFORE if not hasattr(package, name)]
    assert not missing, missing
    assert package.device_tensor is allreducers.device.device_tensor


@pytest.mark.parametrize("wire", WIRES)
def test_each_codec_carries_values_through_its_wires_format_only(wire):
    from allreducers.wire.compact import Bf16Codec, CompactCodec, Fp16Codec
    from allreducers.wire.formats import FORMATS

    coder = codec(wire)
    assert coder.format is FORMATS[wire] and coder.format.name == wire
    # The 16-bit codecs are the one byte layout: they define no method, only their format.
    for kind in (Fp16Codec, Bf16Codec):
        assert not [name for name, value in vars(kind).items() if callable(value)], kind
        assert issubclass(kind, CompactCodec)
    values = torch.tensor([3.0, -1e-3, 1234.5678, 0.0])
    assert torch.equal(coder.quantize(values), coder.format.quantize(values))
    assert coder.exponent(values) == coder.format.exponent(values)
