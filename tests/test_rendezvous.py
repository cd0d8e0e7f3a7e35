"""NCCL's point-to-point rules, modelled in process.

``local_group(P, rendezvous=True)``: a send completes only once its receive is posted.
``ordered=True`` adds NCCL's order: a rank's operations with one peer run one after the other
unless posted as one round (``Transport.start_round``). Every method and wire gives the same bits
in that mode as in the buffered one (so no schedule relies on buffering or on the order of two
operations with a peer), so do the DDP hook's overlapped buckets and FSDP's reduce-scatter, and
schedules that do rely on them are caught with a ``TimeoutError`` instead of a hang.
``python -m tests.rendezvous_check`` runs every method x wire x P in 1..16.
"""

import pytest
import torch

import compressors
from allreducers.transports import Incoming, Outgoing, local_group
from tests.ranks import heavy_tailed
from tests.rendezvous_check import check
from tests.test_fsdp import reduce_scatter
from tests.test_pipeline import blocking, pipelined

CASES = [("fp32", 1), ("fp32", 2), ("fp32", 3), ("fp32", 8), ("fp16", 2), ("fp16", 5), ("bf16", 3)]


@pytest.mark.parametrize(("wire", "workers"), CASES)
@pytest.mark.parametrize("method", compressors.available())
def test_every_method_gives_the_same_bits_under_nccls_rules(method, wire, workers):
    assert check(method, wire, workers) is None


@pytest.mark.parametrize("method", ["spardl", "oktopk", "gtopk"])
def test_overlapped_buckets_give_the_same_bits_under_nccls_rules(method):
    ordered = local_group(3, timeout=60, ordered=True).run(pipelined, method, 0.05)
    reference = local_group(3).run(blocking, method, 0.05)
    for mine, theirs in zip(ordered, reference):
        for (results, residuals, _), (want, want_residuals, _) in zip(mine, theirs):
            assert all(
                torch.equal(a, b) for a, b in zip(results + residuals, want + want_residuals)
            )


def test_fsdps_reduce_scatter_gives_the_same_bits_under_nccls_rules():
    grads = heavy_tailed((2, 3, 90), seed=3)
    buffered = reduce_scatter("spardl", grads, 0.1)
    ordered = reduce_scatter(
        "spardl", grads, 0.1, group=lambda size: local_group(size, 60, ordered=True)
    )
    for mine, theirs in zip(ordered, buffered):
        assert all(torch.equal(a, b) for row, want in zip(mine, theirs) for a, b in zip(row, want))


def _send_first(transport):
    """Both ranks send, wait for their send, and only then post the matching receive."""
    peer = 1 - transport.rank
    handle = transport.isend(torch.ones(4), peer, tag=7)
    transport.waitall([handle])
    return transport.recv(peer, 7, torch.float32, torch.device("cpu"))


def _posted_apart(transport):
    """The receive posted before the send is waited for, but apart from it: two operations."""
    peer = 1 - transport.rank
    receive = transport.irecv(peer, 7, torch.float32, torch.device("cpu"))
    transport.waitall([transport.isend(torch.ones(4), peer, tag=7)])
    return transport.wait_recv(receive)


def _one_round(transport):
    """The same exchange as one round."""
    peer = 1 - transport.rank
    cpu = torch.device("cpu")
    sends, posted = transport.start_round(
        Outgoing(torch.ones(4), peer, 7), Incoming(peer, 7, torch.float32, cpu)
    )
    received = transport.wait_recv(posted)
    transport.waitall(sends)
    return received


def test_a_schedule_that_relies_on_buffering_is_caught():
    assert all(torch.equal(r, torch.ones(4)) for r in local_group(2).run(_send_first))
    with pytest.raises(TimeoutError, match="under rendezvous semantics"):
        local_group(2, timeout=1, rendezvous=True).run(_send_first)
    done = local_group(2, timeout=5, rendezvous=True).run(_posted_apart)
    assert all(torch.equal(r, torch.ones(4)) for r in done)


def test_a_schedule_that_relies_on_the_order_of_two_operations_is_caught():
    with pytest.raises(TimeoutError, match="under NCCL's ordering"):
        local_group(2, timeout=1, ordered=True).run(_posted_apart)
    for rendezvous, ordered in ((False, False), (True, False), (True, True)):
        done = local_group(2, timeout=5, rendezvous=rendezvous, ordered=ordered).run(_one_round)
        assert all(torch.equal(r, torch.ones(4)) for r in done)
