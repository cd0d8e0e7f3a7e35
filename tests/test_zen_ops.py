"""ZEN's call costs a few torch operations a peer, not one per slice of a peer's part, message and
partition: the wire cuts them by one ``split`` a tensor (docs/PERFORMANCE.md, "Operations per
call"), and the bytes and decoded bits stay those of the parts cut one by one."""

import pytest
import torch

from allreducers import WIRES, PartitionCodec, codec
from allreducers.hashing import partition_lists
from allreducers.transports import local_group
from allreducers.wire import BITMAP, COO, bitmap_padded
from syncbench.opcount import count_method

pytestmark = pytest.mark.timeout(120)


def _ops(workers: int, numel: int = 100_000, wire: str = "fp32") -> int:
    def gradient(call: int) -> torch.Tensor:
        return torch.randn(numel, generator=torch.Generator().manual_seed(call))

    return local_group(workers).run(
        lambda transport: count_method(transport, "zen", numel, 0.01, gradient, wire=wire)
    )[0]["ops"]


def test_a_call_grows_far_less_than_its_peers():
    ops = {p: _ops(p) for p in (2, 16)}
    # About 1.9 (the transport's sends remain a peer each); a slice a peer made it 3.1.
    assert ops[16] <= 2.5 * ops[2], ops


@pytest.mark.parametrize("wire", WIRES)
def test_parts_are_the_messages_of_each_part_alone(wire):
    coder = codec(wire)
    generator = torch.Generator().manual_seed(3)
    indices = torch.randperm(5000, generator=generator)[:300].sort().values
    values = torch.randn(300, generator=generator)
    for counts in ([100, 0, 150, 50], [7, 0, 93]):  # all entries, or only the first 100
        messages = coder.encode_parts(indices, values, counts, home=1)
        sent = coder.quantize_parts(values, counts, kept=1)
        assert sent.shape == values.shape and torch.equal(sent[100:], values[100:]) == (
            sum(counts) == 100 or not coder.compact
        )
        start = 0
        for part, count in enumerate(counts):
            span = slice(start, start + count)
            alone = coder.encode([(indices[span], values[span])], False)
            if part == 1 and coder.compact:
                assert messages[part] is None
            else:
                assert torch.equal(messages[part], alone)
            kept = values[span] if part == 1 else coder.quantize(values[span])
            assert torch.equal(sent[span], kept)
            start += count


def _partitions(coder: PartitionCodec, numel: int = 9001, owners: int = 5) -> list:
    """The encoded partitions of a selection dense for some owners, sparse for others."""
    generator = torch.Generator().manual_seed(owners)
    encoded = []
    for owner, owned in enumerate(partition_lists(numel, owners)):
        chosen = torch.rand(owned.numel(), generator=generator) < (0.5 if owner % 2 else 0.005)
        sums = torch.randn(int(chosen.sum()), generator=generator)
        encoded.append((owned, coder.encode(owned, owned[chosen], sums)))
    return encoded


def _decoded(coder: PartitionCodec, received: dict, owned: list) -> list:
    lists = {o: p for o, p in received.items() if p.form == COO}
    bitmaps = {o: p for o, p in received.items() if p.form == BITMAP}
    padded = torch.cat([bitmap_padded(owned[o]) for o in bitmaps])
    sizes = [owned[o].numel() for o in bitmaps]
    return [*coder.decode_lists(lists), *coder.decode_bitmaps(bitmaps, sizes, padded)]


@pytest.mark.parametrize("wire", WIRES)
def test_split_pieces_decode_as_the_bodies_cut_one_by_one(wire):
    coder = PartitionCodec(codec(wire), "auto")
    owned, encoded = zip(*_partitions(coder))
    assert {part.form for part in encoded} == {COO, BITMAP}
    message = coder.join(encoded, torch.device("cpu"))
    received = dict(enumerate(coder.split(message, len(encoded))))
    assert all(part.pieces is not None for part in received.values())
    bare = {owner: part._replace(pieces=None) for owner, part in received.items()}
    for cut, alone in zip(_decoded(coder, received, owned), _decoded(coder, bare, owned)):
        assert torch.equal(cut, alone)


@pytest.mark.parametrize("wire", WIRES)
def test_pull_messages_that_do_not_fit_are_refused(wire):
    coder = PartitionCodec(codec(wire), "bitmap")
    owned, encoded = zip(*_partitions(coder, owners=3))
    message = coder.join(encoded, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="malformed pull message"):
        coder.split(message[:4], len(encoded))  # shorter than its headers
    lying = message.clone()
    lying[1] += 1  # the first partition's count: its bitmap seems a value shorter
    received = dict(enumerate(coder.split(lying, len(encoded))))
    with pytest.raises(RuntimeError, match="malformed partitions"):
        _decoded(coder, received, owned)
