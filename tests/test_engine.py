"""The one schedule engine on an in-process group: when it calls back, and what it gathers."""

import pytest
import torch

from allreducers import (
    allgather_lists,
    allgather_rows,
    bruck_allgather_schedule,
    codec,
    run_schedule,
)
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport
from syncbench.opcount import OperationCounter, count_method


def own_list(rank: int) -> tuple:
    """Rank ``rank``'s sparse list: a few int32 indices and float values unique to the rank."""
    indices = torch.arange(rank, rank + 3 * (rank + 1), rank + 1, dtype=torch.int32)
    return indices, indices.float() * 0.5 + rank


def logged(transport, log: list):
    """``transport`` with its rounds posted and its receives waited for appended to ``log``."""
    start, wait = transport.start_round, transport.wait_recv
    transport.start_round = lambda *args: (log.append("post"), start(*args))[1]
    transport.wait_recv = lambda *args: (log.append("recv"), wait(*args))[1]
    return transport


@pytest.mark.parametrize("schedule, sizes", [(bruck_allgather_schedule, [1, 2, 3, 5, 6, 8])])
def test_meanwhile_runs_between_each_send_and_its_receive_with_the_lists_held_so_far(
    schedule, sizes
):
    for size in sizes:

        def body(transport, size=size):
            log, seen = [], []
            steps = schedule(transport.rank, list(range(size)))

            def meanwhile(held):
                log.append("meanwhile")
                seen.append(sorted(held))

            plain = allgather_lists(
                transport, steps, transport.rank, own_list(transport.rank), None
            )
            gathered = allgather_lists(
                logged(transport, log),
                steps,
                transport.rank,
                own_list(transport.rank),
                None,
                meanwhile=meanwhile,
            )
            return steps, log, seen, gathered, plain

        for rank, (steps, log, seen, gathered, plain) in enumerate(local_group(size).run(body)):
            assert log == ["post", "meanwhile", "recv"] * len(steps)
            earlier = {rank}
            for step, items in zip(steps, seen):
                assert items == sorted(earlier), "meanwhile sees the lists of earlier steps only"
                earlier |= set(step.recv_items)
            assert sorted(gathered) == sorted(plain) == list(range(size))
            for item, (indices, values) in gathered.items():
                expected_indices, expected_values = own_list(item)
                assert torch.equal(indices, expected_indices) and torch.equal(
                    values, expected_values
                )
                assert torch.equal(plain[item][0], indices) and torch.equal(plain[item][1], values)


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fixed", [False, True])
def test_allgather_lists_at_every_wire_gives_every_rank_the_same_lists(wire, fixed):
    """Quantized once by their owner, lists keep their bits however often they are forwarded."""
    from allreducers import codec

    coder = codec(wire)
    for size in (1, 2, 3, 5, 8):

        def body(transport, size=size):
            rank = transport.rank
            indices = torch.arange(rank, 70000 * 3, 70000 // 4 + rank, dtype=torch.int64)[:12]
            values = coder.quantize(torch.linspace(-1.0, 1.0, 12) * 10.0 ** (rank - 2))
            steps = bruck_allgather_schedule(rank, list(range(size)))
            held = allgather_lists(
                transport, steps, rank, (indices, values), 12 if fixed else None, wire=wire
            )
            return held, (indices, values), transport.traffic.bytes_sent

        results = local_group(size).run(body)
        for held, _, _ in results:
            assert sorted(held) == list(range(size))
            for item, (indices, values) in held.items():
                expected_indices, expected_values = results[item][1]
                assert indices.tolist() == expected_indices.tolist()
                assert torch.equal(values, expected_values)
        if size > 1 and wire != "fp32":  # 16-bit offsets and values: about half of fp32's
            assert results[0][2] < 12 * 8 * (size - 1)


@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("workers", [1, 3, 4, 7])
def test_allgather_rows_gives_every_rank_every_row_in_place_without_reads(wire, workers):
    """Row r of each rank's tables is item (rank + r) % P afterwards; nothing is read back."""
    span, width = 200_000, 5  # columns past 65,536: the rows' segment counts travel

    def body(transport):
        rank = transport.rank
        columns = torch.empty((workers, width), dtype=torch.int64)
        values = torch.empty((workers, width))
        columns[0] = torch.arange(width) * 30_000 + rank
        values[0] = codec(wire).quantize_rows(torch.randn(1, width) * (rank + 1)).view(-1)
        expected = (columns[0].clone(), values[0].clone())
        steps = bruck_allgather_schedule(rank, list(range(workers)))
        with OperationCounter() as counter:
            allgather_rows(transport, steps, (columns, values), span, wire=wire)
        return expected, columns, values, counter.data_dependent

    results = local_group(workers).run(body)
    for rank, (_, columns, values, reads) in enumerate(results):
        assert reads == 0
        for row in range(workers):
            own_columns, own_values = results[(rank + row) % workers][0]
            assert torch.equal(columns[row], own_columns)
            assert torch.equal(values[row], own_values)


@pytest.mark.parametrize("method,wire", [("topk", "fp16"), ("gtopk", "fp32"), ("gtopk", "fp16")])
@pytest.mark.parametrize("workers", [3, 4])
def test_fixed_size_lists_read_nothing_from_the_device(method, wire, workers):
    def gradient(call: int) -> torch.Tensor:
        return torch.randn(30_000, generator=torch.Generator().manual_seed(call))

    counts = local_group(workers).run(
        lambda transport: count_method(transport, method, 30_000, 0.01, gradient, wire=wire)
    )
    assert all(count["data_dependent_ops"] == 0 for count in counts), counts


class _CallLog(RecordingTransport):
    """Logs the order of sends, posted receives, waits for them, and (from the test) work."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.calls = []

    def isend(self, tensor, dest, tag, sized=False):
        self.calls.append("isend")
        return super().isend(tensor, dest, tag, sized)

    def irecv(self, source, tag, dtype, device, numel=None, out=None):
        self.calls.append("irecv")
        return super().irecv(source, tag, dtype, device, numel, out)

    def wait_recv(self, handle):
        self.calls.append("wait_recv")
        return super().wait_recv(handle)


def test_a_receive_of_known_length_is_posted_before_the_work_meanwhile():
    """Gloo, and MPI for large messages, move a message only once its receive is posted."""

    def body(transport):
        steps = bruck_allgather_schedule(transport.rank, range(4))
        log = _CallLog(transport)
        got = []
        run_schedule(
            log,
            steps,
            lambda step: torch.full((3,), float(transport.rank)),
            lambda step, message: got.append(message.clone()),
            torch.device("cpu"),
            meanwhile=lambda step: log.calls.append("meanwhile"),
            dtype=torch.float32,
            recv_numel=lambda step: 3,
        )
        sources = [step.recv_from for step in steps]
        return log.calls, [int(message[0]) for message in got], sources

    for calls, got, sources in local_group(4).run(body):
        assert calls == ["isend", "irecv", "meanwhile", "wait_recv"] * 2, calls
        assert got == sources


def test_a_receive_of_known_length_refuses_a_message_of_another():
    def body(transport):
        if transport.rank == 0:
            transport.waitall([transport.isend(torch.zeros(5), 1, 0, sized=True)])
            return None
        handle = transport.irecv(0, 0, torch.float32, torch.device("cpu"), numel=8)
        with pytest.raises(RuntimeError, match="malformed message from rank 0: 5 elements"):
            transport.wait_recv(handle)
        return True

    assert local_group(2).run(body)[1]
