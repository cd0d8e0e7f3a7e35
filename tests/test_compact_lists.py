"""Sparse lists at a 16-bit wire without a read from the device (docs/DESIGN.md, "The wire").

Lists whose indices ascend in a known span travel with fixed segment counts instead of runs;
each list's exponent is computed on the device; a one-list message's count follows from its
length. So ZEN's, Ok-Topk's, TopkDSA's and Gaussian-k's calls read no more at fp16 than at
fp32, and their operations stop growing by a few per peer and list.
"""

import pytest
import torch

from allreducers import codec
from allreducers.transports import local_group
from syncbench.opcount import OperationCounter, count_method

pytestmark = pytest.mark.timeout(120)

COMPACT = ["fp16", "bf16"]
#: Ascending lists and the spans they lie in: no segment counts, a few, many, near 2^31.
SPANS = {
    "empty": ([], 70_000),
    "one": ([7], 65_536),
    "span 65536": ([10, 500, 65_535], 65_536),
    "two segments": ([10, *range(100, 1000, 100), 65_545], 65_546),
    "repeats": ([3, 3, 70_000, 70_000, 70_001] * 1, 70_002),
    "near 2^31-1": ([2**31 - 70_000, 2**31 - 65_536, 2**31 - 2, 2**31 - 1], 2**31),
    "dense over 40 segments": (list(range(0, 40 * 65_536, 97)), 40 * 65_536),
}


def _values(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, generator=generator) * 10.0 ** torch.randint(-3, 4, (count,))


@pytest.mark.parametrize("wire", COMPACT)
@pytest.mark.parametrize("case", sorted(SPANS))
def test_lists_of_a_span_round_trip_exactly(wire, case):
    entries, span = SPANS[case]
    coder = codec(wire)
    indices, values = torch.tensor(entries, dtype=torch.int64), _values(len(entries))
    message = coder.encode([(indices, values)], False, span)
    for got, got_values in (
        coder.decode_one(message, span),
        coder.decode(message, 1, None, span)[0],
    ):
        assert got.dtype == torch.int32 and got.tolist() == entries
        assert torch.equal(got_values, coder.quantize(values))
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode(message, 1, [len(entries) + 1], span)


@pytest.mark.parametrize("wire", COMPACT)
def test_several_lists_of_either_form_decode_with_or_without_sizes(wire):
    coder = codec(wire)
    span = 300_000  # 5 segments: a list of more than 10 entries travels as offsets
    generator = torch.Generator().manual_seed(1)
    sizes = [400, 3, 0, 11, 10]
    lists = [
        (torch.randperm(span, generator=generator)[:size].sort().values, _values(size, size))
        for size in sizes
    ]
    message = coder.encode(lists, True, span)
    for decoded in (coder.decode(message, 5, None, span), coder.decode(message, 5, sizes, span)):
        for (indices, values), (got, got_values) in zip(lists, decoded):
            assert got.tolist() == indices.tolist()
            assert torch.equal(got_values, coder.quantize(values))


@pytest.mark.parametrize("wire", COMPACT)
def test_parts_and_joined_lists_are_the_lists_alone(wire):
    coder = codec(wire)
    span = 300_000
    counts = [2000, 3, 0, 500, 11]  # offsets, int32, empty, offsets, offsets
    indices = torch.cat(
        [
            torch.randperm(span, generator=torch.Generator().manual_seed(c))[:c].sort().values
            for c in counts
        ]
    )
    values = _values(sum(counts), 2)
    sent = coder.quantize_parts(values, counts, kept=1)
    messages = coder.encode_parts(indices, sent, counts, home=1, span=span)
    assert messages[1] is None
    pieces = list(zip(indices.split(counts), sent.split(counts)))
    for part, message in enumerate(messages):
        if part != 1:
            assert torch.equal(message, coder.encode([pieces[part]], False, span))
    items = [pieces[1] if part == 1 else message for part, message in enumerate(messages)]
    joined, joined_values, sizes = coder.decode_joined(items, span)
    assert sizes == counts
    assert joined.tolist() == indices.tolist()
    assert torch.equal(joined_values, sent)
    kept = [
        values.split(counts)[1] if p == 1 else coder.quantize(v)
        for p, v in enumerate(values.split(counts))
    ]
    assert torch.equal(sent, torch.cat(kept))


@pytest.mark.parametrize("wire", [*COMPACT, "fp32"])
def test_quantize_encode_parts_is_quantize_then_encode(wire):
    """One pass for both gives ``quantize_parts``' values and messages that decode as
    ``encode_parts``' of them, also where a part's largest value rounds down to 65,504 x 2^-1
    at fp16 (there the exponents differ, the decoded values do not)."""
    coder = codec(wire)
    span, counts = 300_000, [700, 2, 0, 400, 5]
    indices = torch.cat([torch.arange(0, 3 * c, 3) for c in counts])
    values = _values(sum(counts), 4)
    values[703] = 32_755.0  # part 3's largest: rounds down to 32,752 = 65,504 x 2^-1
    sent, messages = coder.quantize_encode_parts(indices, values, counts, 1, span)
    assert torch.equal(sent, coder.quantize_parts(values, counts, 1))
    assert (messages[1] is None) == coder.compact  # fp32 codes the home part too
    expected = coder.encode_parts(indices, sent, counts, 1, span)
    for part, (message, other) in enumerate(zip(messages, expected)):
        if part != 1:
            assert message.numel() == other.numel()
            got, want = coder.decode_one(message, span), coder.decode_one(other, span)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if wire == "fp16":
        assert sent[703] == 32_752.0 and not torch.equal(messages[3], expected[3])


@pytest.mark.parametrize("wire", COMPACT)
def test_coding_lists_reads_nothing_but_bf16_s_overflow_check(wire):
    """Fails on the code before: per list an exponent, runs and counts were read."""
    coder = codec(wire)
    span, counts = 300_000, [900, 3, 0, 500]
    indices = torch.arange(0, 3 * sum(counts), 3)
    values = _values(sum(counts), 3)
    with OperationCounter() as counter:
        sent = coder.quantize_parts(values, counts, kept=0)
        messages = coder.encode_parts(indices, sent, counts, home=0, span=span)
        coder.decode_joined([(indices[:900], values[:900]), *messages[1:]], span)
        message = coder.encode([(indices, values)], False, span)
        coder.decode(message, 1, [sum(counts)], span)
        coder.decode_one(message, span)
        coder.decode_values(coder.encode_values(list(values.split(counts))), counts)
    # bf16's quantization checks for overflow (one read); the encoders take quantized values
    assert counter.data_dependent == (1 if wire == "bf16" else 0)


def _count(method: str, workers: int, wire: str) -> dict:
    def gradient(call: int) -> torch.Tensor:
        return torch.randn(30_000, generator=torch.Generator().manual_seed(call))

    return local_group(workers).run(
        lambda transport: count_method(transport, method, 30_000, 0.02, gradient, wire=wire)
    )[0]


@pytest.mark.parametrize("method", ["zen", "oktopk", "topkdsa", "gaussiank"])
def test_a_16_bit_wire_reads_no_more_than_fp32_and_grows_slowly(method):
    fp32, fp16, large = (
        _count(method, 4, "fp32"),
        _count(method, 4, "fp16"),
        _count(method, 12, "fp16"),
    )
    # Before, the 16-bit lists read their exponent, runs and counts: ZEN 46 at P = 4 against 5
    assert fp16["data_dependent_ops"] <= fp32["data_dependent_ops"], (fp16, fp32)
    # ... and cost a few operations a peer and list: ZEN 1173 at P = 16 against 392 at P = 4
    assert large["ops"] <= 2 * fp16["ops"], (large, fp16)
