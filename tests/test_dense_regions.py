"""Coding without work per entry where none is needed. Dense regions at every wire
(``Codec.encode_region`` and its kin): the messages, values and residuals of ``encode_values``
and ``quantize_parts`` over 65,536-value pieces, coded as 2-D views with no index per entry;
what a call allocates, as the operation counter sees it; lists' segment counts by a binary
search on the CPU."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import compressors
from allreducers import WIRES, codec
from allreducers.transports import local_group
from allreducers.wire import PIECE
from syncbench.opcount import OperationCounter
from tests.ranks import heavy_tailed

pytestmark = pytest.mark.timeout(120)

SIZES = [0, 7, PIECE, 2 * PIECE + 3]  # empty, one short piece, one full, two full and a short


def _pieces(size: int) -> list:
    return [min(PIECE, size - start) for start in range(0, size, PIECE)]


@pytest.mark.parametrize("wire", WIRES)
def test_regions_travel_as_the_pieces_of_encode_values(wire):
    coder = codec(wire)
    regions = [heavy_tailed(size, seed) * 10.0**seed for seed, size in enumerate(SIZES)]
    pieces = [_pieces(size) for size in SIZES]
    quantized = [coder.quantize_parts(region, sizes, -1) for region, sizes in zip(regions, pieces)]
    sent = [region.clone() for region in regions]
    alone = [coder.encode_region(region, residual=True) for region in sent]
    for one, region, sizes in zip(alone, quantized, pieces):  # each region's own message
        assert one.dtype == coder.recv_dtype
        expected = coder.encode_values(list(region.split(sizes))) if sizes else one[:0]
        assert torch.equal(one, expected)
    coded = [coder.split_regions(one, [size])[0] for one, size in zip(alone, SIZES)]
    message = coder.join_regions(coded)
    flat = [piece for region, sizes in zip(quantized, pieces) for piece in region.split(sizes)]
    assert message.dtype == coder.recv_dtype
    assert torch.equal(message, coder.encode_values(flat))
    for region, left, travelled in zip(regions, sent, quantized):
        # What the wire removed stays (zero at fp32, where the region is left as it was).
        expected = region if wire == "fp32" else region - travelled
        assert torch.equal(left.view(torch.int32), expected.view(torch.int32))
    for part, travelled in zip(coder.split_regions(message, SIZES), quantized):
        out = torch.full_like(travelled, 0.25)
        assert torch.equal(coder.decode_region(part, out.clone()), travelled)
        assert torch.equal(coder.decode_region(part, out, add=True), 0.25 + travelled)
    with pytest.raises(RuntimeError, match="malformed"):
        coder.split_regions(message, [*SIZES[:-1], SIZES[-1] + 1])


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_dense_call_makes_no_index_per_entry(wire):
    """The 16-bit dense call codes its regions as 2-D views: no int64 tensor as long as a region
    (per-piece list numbers, spread per entry, took 31 times the gradient's bytes a call)."""
    numel, workers = 3 * PIECE + 11, 3

    class Shapes(TorchDispatchMode):
        made: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                self.made.append((func.__name__, out.dtype, out.numel()))
            return out

    def body(transport):
        sync = compressors.create("dense", transport, numel=numel, wire=wire)
        grad = heavy_tailed(numel, transport.rank)
        sync.allreduce(grad)
        with Shapes() as shapes:
            sync.allreduce(grad)
        return shapes.made

    made = local_group(workers).run(body)[0]
    long = [row for row in made if row[1] == torch.int64 and row[2] >= numel // workers]
    assert made and not long, long


def test_the_counter_adds_the_bytes_of_new_tensors_only():
    base = torch.zeros(100)
    with OperationCounter() as counter:
        fresh = torch.empty(50)  # 200 bytes
        base[:10].add_(1.0)  # in place: none
        base.view(10, 10)  # a view: none
        fresh.double()  # 400 bytes
    assert counter.allocated_bytes == 200 + 400


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_segment_counts_by_search_and_by_scatter_agree_with_a_count(dtype):
    """The CPU's binary search and the device's scatter-add give each list's entries per
    65,536-wide segment (here on CPU tensors both)."""
    from allreducers.wire.layout import Lists, scattered_counts, searched_counts

    generator = torch.Generator().manual_seed(0)
    span, counts = 5 * PIECE + 17, [0, 1, 900, 3000, 2]
    parts = [torch.randperm(span, generator=generator)[:count].sort().values for count in counts]
    indices = torch.cat(parts).to(dtype)
    segments = -(-span // PIECE)
    expected = torch.tensor(
        [[int(((part >> 16) == s).sum()) for s in range(segments)] for part in parts],
        dtype=torch.int32,
    )
    lists = Lists(counts, indices.device)
    assert torch.equal(searched_counts(indices, lists, segments), expected)
    assert torch.equal(scattered_counts(indices, lists, segments).view(len(counts), -1), expected)


@pytest.mark.parametrize("wire", WIRES)
def test_allgather_regions_gathers_every_region_and_sends_the_own_one_itself(wire):
    """Every rank decodes every rank's region; the own region leaves as its message (no copy)."""
    from allreducers import allgather_regions, bruck_allgather_schedule

    sizes = [PIECE + 5, 3, 2 * PIECE, 11]
    regions = [heavy_tailed(size, rank) * 10.0**rank for rank, size in enumerate(sizes)]
    coder = codec(wire)

    def body(transport):
        rank, sent = transport.rank, []
        send = transport.isend
        transport.isend = lambda tensor, *args, **kw: sent.append(tensor) or send(tensor, *args)
        message = coder.encode_region(regions[rank].clone())
        steps = bruck_allgather_schedule(rank, list(range(len(sizes))))
        coded = allgather_regions(transport, steps, coder, rank, message, sizes)
        out = [
            coder.decode_region(coded[item], torch.empty(size)) for item, size in enumerate(sizes)
        ]
        return out, sent[0] is message

    expected = [coder.quantize_parts(region, _pieces(region.numel()), -1) for region in regions]
    for out, own_sent_itself in local_group(len(sizes), timeout=60).run(body):
        assert own_sent_itself
        for got, want in zip(out, expected):
            assert torch.equal(got, want)
