"""``local_group(P, rendezvous=True)``: a send completes only once its receive is posted, as
under NCCL's point-to-point and MPI's large messages. Every method and wire gives the same bits
as in the buffered mode (so no schedule relies on buffering), and a schedule that does is caught
with a ``TimeoutError`` instead of a hang."""

import pytest
import torch

import compressors
from allreducers.transports import local_group


def _calls(transport, method, wire, numel=301):
    sync = compressors.create(method, transport, numel=numel, density=0.05, wire=wire)
    draws = torch.Generator().manual_seed(transport.rank)
    return [sync.allreduce(torch.randn(numel, generator=draws)).clone() for _ in range(3)]


@pytest.mark.parametrize("workers", [2, 3, 5, 8])
@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("method", compressors.available())
def test_every_method_gives_the_same_bits_when_sends_wait_for_their_receives(method, wire, workers):
    buffered = local_group(workers).run(_calls, method, wire)
    rendezvous = local_group(workers, timeout=60, rendezvous=True).run(_calls, method, wire)
    for mine, theirs in zip(rendezvous, buffered):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def _send_first(transport):
    """Both ranks send, wait for their send, and only then post the matching receive."""
    peer = 1 - transport.rank
    handle = transport.isend(torch.ones(4), peer, tag=7)
    transport.waitall([handle])
    return transport.recv(peer, 7, torch.float32, torch.device("cpu"))


def _posted_together(transport):
    """The same exchange with the receive posted before the send is waited for."""
    peer = 1 - transport.rank
    receive = transport.irecv(peer, 7, torch.float32, torch.device("cpu"))
    transport.waitall([transport.isend(torch.ones(4), peer, tag=7)])
    return transport.wait_recv(receive)


def test_a_schedule_that_relies_on_buffering_is_caught():
    assert all(torch.equal(r, torch.ones(4)) for r in local_group(2).run(_send_first))
    with pytest.raises(TimeoutError, match="under rendezvous semantics"):
        local_group(2, timeout=1, rendezvous=True).run(_send_first)
    done = local_group(2, timeout=5, rendezvous=True).run(_posted_together)
    assert all(torch.equal(r, torch.ones(4)) for r in done)
