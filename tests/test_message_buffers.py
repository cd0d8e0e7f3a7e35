"""Message buffers made once per synchronizer and reused: no call allocates its messages again."""

import pytest
import torch

import compressors
from allreducers import MessageBuffers, codec
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport, ReplayTransport
from syncbench.opcount import OperationCounter


def _second_call(workers: int, numel: int, wire: str = "fp32", **options) -> list:
    """Per rank: (bytes the second call allocated, bytes it sent), with ``out`` given."""

    def body(transport):
        sync = compressors.create(
            "spardl", transport, numel=numel, density=0.01, wire=wire, **options
        )
        out = torch.empty(numel)
        grads = [
            torch.randn(numel, generator=torch.Generator().manual_seed(10 * call + transport.rank))
            for call in range(2)
        ]
        sync.allreduce(grads[0], out=out)
        with OperationCounter() as counter:
            sync.allreduce(grads[1], out=out)
        return counter.allocated_bytes, sync.stats["bytes_sent"]

    return local_group(workers, timeout=60).run(body)


@pytest.mark.parametrize("workers", [1, 3, 4, 16])
def test_spardl_call_allocates_no_message(workers):
    """With ``out`` given, a one-team fp32 call allocates only the in-process transport's copies.

    That transport copies each message it carries (its "wire"): as many bytes as were sent.
    Everything else a call needs (its messages, receive buffers, tables) was made before.
    """
    for allocated, sent in _second_call(workers, 100_003):
        assert allocated - sent <= 64, (allocated, sent)


def test_buffers_are_kept_per_role_size_and_dtype():
    buffers = MessageBuffers()
    first = buffers.get("send", 10, torch.int32, "cpu")
    assert buffers.get("send", 10, torch.int32, "cpu") is first
    assert buffers.get("recv", 10, torch.int32, "cpu") is not first
    assert buffers.get("send", 12, torch.int32, "cpu").numel() == 12
    assert buffers.get("send", 10, torch.uint8, "cpu").dtype == torch.uint8


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
def test_encode_rows_into_a_buffer_is_the_same_message(wire):
    coder = codec(wire)
    span, rows, width = 200_000, 3, 40
    generator = torch.Generator().manual_seed(1)
    columns = torch.sort(torch.randperm(span, generator=generator)[: rows * width].view(rows, -1))
    columns = columns.values.to(torch.int32)
    values = coder.quantize_rows(torch.randn(rows, width, generator=generator))
    expected = coder.encode_rows(columns, values, span)
    buffer = torch.full((coder.rows_size(rows, width, span),), 7, dtype=coder.recv_dtype)
    assert coder.encode_rows(columns, values, span, out=buffer) is buffer
    assert torch.equal(buffer, expected)
    with pytest.raises(ValueError, match="does not fit"):
        coder.encode_rows(columns, values, span, out=buffer[1:])


def test_replay_receives_into_the_buffer():
    """A replayed sized receive writes its recorded payload into the caller's buffer."""

    def body(transport):
        recording = RecordingTransport(transport, keep_payloads=True)
        peer = 1 - transport.rank
        recording.isend(torch.arange(4, dtype=torch.int32) + transport.rank, peer, 0, sized=True)
        recording.recv(peer, 0, torch.int32, torch.device("cpu"), numel=4)
        return recording.take()

    events = local_group(2, timeout=60).run(body)[0]
    replay = ReplayTransport(events, rank=0, size=2)
    buffer = torch.zeros(4, dtype=torch.int32)
    message = replay.recv(1, 0, torch.int32, torch.device("cpu"), numel=4, out=buffer)
    assert message is buffer and buffer.tolist() == [1, 2, 3, 4]
