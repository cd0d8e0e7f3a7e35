"""Ok-Topk's split-and-reduce with several exchanges in flight: the same bits as one blocking
exchange per step, and never more than ``in_flight`` (at most P-1) sends or receives outstanding."""

import pytest
import torch

import allreducers
import compressors
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport
from tests.ranks import heavy_tailed

SHORT = dict(local_interval=2, global_interval=3, region_interval=2)  # every path in a few calls


def one_step_at_a_time(transport, steps, produce, consume, device, timer, window, dtype=None):
    """The split-and-reduce as it ran before exchanges overlapped: the engine's blocking loop."""
    dtype = torch.int32 if dtype is None else dtype
    allreducers.run_schedule(transport, steps, produce, consume, device, timer, dtype=dtype)


def synchronize(workers, grads, **options):
    """Per rank and call: result, residual, thresholds, boundaries and counted stats."""

    def body(transport):
        sync = compressors.create(
            "oktopk", transport, numel=grads.shape[-1], density=0.05, **SHORT, **options
        )
        calls = []
        for grad in grads:
            result = sync.allreduce(grad[transport.rank].clone())
            stats = {key: value for key, value in sync.stats.items() if key != "seconds"}
            calls.append(
                (
                    result,
                    sync.residual.clone(),
                    sync.local_threshold,
                    sync.global_threshold,
                    list(sync.boundaries),
                    stats,
                )
            )
        return calls

    return local_group(workers).run(body)


def assert_identical(got, expected):
    for rank_got, rank_expected in zip(got, expected):
        for call_got, call_expected in zip(rank_got, rank_expected):
            assert torch.equal(call_got[0].view(torch.int32), call_expected[0].view(torch.int32))
            assert torch.equal(call_got[1].view(torch.int32), call_expected[1].view(torch.int32))
            assert call_got[2:] == call_expected[2:]


@pytest.mark.parametrize("workers", [2, 3, 5, 8])
def test_overlapped_exchanges_give_the_bits_of_one_blocking_exchange_per_step(workers, monkeypatch):
    grads = heavy_tailed((6, workers, 3001), workers)
    overlapped = {window: synchronize(workers, grads, in_flight=window) for window in (1, 2, 4)}
    monkeypatch.setattr(allreducers.regions, "run_windowed", one_step_at_a_time)
    blocking = synchronize(workers, grads)
    for result in overlapped.values():
        assert_identical(result, blocking)
    assert blocking[0][-1][5]["rounds"] == workers - 1 + allreducers.ceil_log2(
        workers
    )  # a reuse call


class CountingTransport(RecordingTransport):
    """Counts this rank's outstanding sends and receives; logs how many were outstanding each
    time a received message is waited for (the moment the previous one was reduced)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.sends = self.receives = self.most = 0
        self.at_wait = []

    def isend(self, tensor, dest, tag):
        self.sends += 1
        self.most = max(self.most, self.sends, self.receives)
        return super().isend(tensor, dest, tag)

    def waitall(self, handles):
        self.sends -= len(handles)
        return super().waitall(handles)

    def irecv(self, source, tag, dtype, device):
        self.receives += 1
        self.most = max(self.most, self.sends, self.receives)
        return super().irecv(source, tag, dtype, device)

    def wait_recv(self, handle):
        self.at_wait.append(self.receives)
        self.receives -= 1
        return super().wait_recv(handle)


@pytest.mark.parametrize("workers,in_flight", [(8, 4), (6, 4), (3, 4), (8, 1), (8, 2)])
def test_at_most_in_flight_exchanges_are_outstanding(workers, in_flight):
    grads = heavy_tailed((2, workers, 2000), workers + 10)
    window = min(in_flight, workers - 1)

    def body(transport):
        counting = CountingTransport(transport)
        sync = compressors.create("oktopk", counting, numel=2000, density=0.05, in_flight=in_flight)
        sync.allreduce(grads[0, transport.rank].clone())  # exact call: its gather uses recv
        counting.at_wait.clear()
        sync.allreduce(grads[1, transport.rank].clone())
        return counting.most, counting.at_wait, (counting.sends, counting.receives)

    for most, at_wait, left in local_group(workers).run(body):
        assert most == window and left == (0, 0)
        # While step j's region is reduced, steps j+1 .. j+window are under way; then the
        # all-gather's ceil(log2 P) rounds, one receive each.
        windowed = [min(window, workers - 1 - step) for step in range(workers - 1)]
        assert at_wait == windowed + [1] * allreducers.ceil_log2(workers)


def test_in_flight_must_be_a_positive_integer():
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="in_flight"):
            compressors.create(
                "oktopk", local_group(1).rank(0), numel=100, density=0.1, in_flight=bad
            )
    assert compressors.option_defaults("oktopk")["in_flight"] == 4
