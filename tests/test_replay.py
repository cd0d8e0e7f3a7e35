"""Recording one rank's call with its payloads and replaying it alone.

The recording and replaying transports are allreducers.transports.recording's."""

import pytest
import torch

import compressors
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport, ReplayTransport
from tests.ranks import heavy_tailed

COUNTS = ("bytes_sent", "messages", "rounds", "nnz")


def record(method, workers, numel=901, density=0.03, seed=1):
    """Per rank: the state before call 1, that call's events with payloads, result, residual,
    stats; and the gradients of every call."""
    grads = heavy_tailed((2, workers, numel), seed)

    def body(transport):
        recorder = RecordingTransport(transport, keep_payloads=True)
        sync = compressors.create(method, recorder, numel=numel, density=density)
        sync.allreduce(grads[0, transport.rank])
        recorder.take()
        state = sync.state_dict()
        result = sync.allreduce(grads[1, transport.rank]).clone()
        return state, recorder.take(), result, sync.residual.clone(), dict(sync.stats)

    return local_group(workers).run(body), grads


@pytest.mark.parametrize("method", compressors.available())
@pytest.mark.parametrize("workers", [1, 3, 4, 6])
def test_replay_repeats_every_ranks_call_bit_for_bit(method, workers):
    recorded, grads = record(method, workers)
    for rank, (state, events, result, residual, stats) in enumerate(recorded):
        transport = ReplayTransport(events, rank, workers)
        sync = compressors.create(method, transport, numel=901, density=0.03)
        for _ in range(2):  # started over: the same call again
            transport.rewind()
            sync.load_state_dict(state)
            assert torch.equal(sync.allreduce(grads[1, rank]), result), (method, rank)
            assert torch.equal(sync.residual, residual), (method, rank)
            assert {k: sync.stats[k] for k in COUNTS} == {k: stats[k] for k in COUNTS}


def test_a_replay_that_leaves_the_recording_raises():
    recorded, grads = record("spardl", 4)
    state, events = recorded[0][:2]
    transport = ReplayTransport(events, 0, 4)
    sync = compressors.create("spardl", transport, numel=901, density=0.03)
    sync.load_state_dict(state)
    sync.allreduce(grads[1, 0])
    with pytest.raises(ValueError, match="beyond the recording"):
        sync.allreduce(grads[1, 0])  # not rewound
    other = compressors.create("topk", ReplayTransport(events, 0, 4), numel=901, density=0.03)
    with pytest.raises(ValueError, match="asked for a"):
        other.allreduce(grads[1, 0])  # another method's messages


def test_replay_needs_recorded_payloads():
    def body(transport):
        recorder = RecordingTransport(transport)
        compressors.create("topk", recorder, numel=100, density=0.1).allreduce(torch.ones(100))
        return recorder.take()

    with pytest.raises(ValueError, match="keep_payloads=True"):
        ReplayTransport(local_group(2).run(body)[0], 0, 2)
