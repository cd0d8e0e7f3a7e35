"""Run under ``mpiexec -n P``: every method's ``bytes_sent`` is the bytes it put on the wire.

Each rank wraps the MPI transport so that it adds up the bytes of every buffer handed to MPI's
``Isend`` and of every message received, and counts each library all-reduce as the transport's
accounting does (its bytes inside MPI are not observable). For every method and wire format,
``stats["bytes_sent"]`` must equal the bytes sent so, and all ranks together must have received
exactly what they sent. Results must agree on every rank. Any failed check raises, which aborts
the whole job with a non-zero status.
"""

import numpy as np
import torch
from mpi4py import MPI

import compressors
from allreducers import WIRES
from allreducers.transports.lifecycle import abort_on_uncaught_exception
from allreducers.transports.mpi import MPITransport

abort_on_uncaught_exception()
torch.set_num_threads(1)
world = MPI.COMM_WORLD
rank, workers = world.Get_rank(), world.Get_size()
OPTIONS = {"oktopk": dict(local_interval=2, global_interval=3, region_interval=2)}


class Counting(MPITransport):
    """The MPI transport, adding up what it hands to MPI and what it receives."""

    def __init__(self, comm) -> None:
        super().__init__(comm)
        self.sent = self.received = self.reduced = self.depth = 0
        self.waiting = False

    def _isend(self, tensor, dest, tag):
        handle = super()._isend(tensor, dest, tag)
        self.sent += handle.buffer.numpy().nbytes  # the buffer MPI sends from
        return handle

    def _recv(self, source, tag, dtype, device, out=None):
        message = super()._recv(source, tag, dtype, device, out)
        if not self.waiting:  # a receive that _wait_recv finishes is counted there
            self.received += message.numel() * message.element_size()
        return message

    def _wait_recv(self, handle):
        self.waiting = True
        try:
            message = super()._wait_recv(handle)
        finally:
            self.waiting = False
        self.received += message.numel() * message.element_size()
        return message

    def _reduced(self, tensor) -> None:
        if not self.depth and workers > 1:
            nbytes = tensor.numel() * tensor.element_size()
            self.reduced += 2 * (workers - 1) * nbytes // workers

    def allreduce_sum_(self, tensor):
        self._reduced(tensor)
        self.depth += 1
        try:
            return super().allreduce_sum_(tensor)
        finally:
            self.depth -= 1

    def allreduce_sum(self, tensor, out=None):
        self._reduced(tensor if out is None else out)
        self.depth += 1
        try:
            return super().allreduce_sum(tensor, out)
        finally:
            self.depth -= 1


def check(method, wire, numel, density, calls=3):
    transport = Counting(world)
    options = dict(OPTIONS.get(method, {}), wire=wire)
    sync = compressors.create(method, transport, numel=numel, density=density, **options)
    sync.check_agreement()  # the ranks' one-time agreement, outside every call's stats
    for call in range(calls):
        rng = np.random.default_rng(1000 * call + numel)
        grads = torch.from_numpy(rng.standard_t(3, (workers, numel)).astype(np.float32))
        transport.sent = transport.received = transport.reduced = 0
        result = sync.allreduce(grads[rank].clone())
        counted = sync.stats["bytes_sent"]
        assert counted == transport.sent + transport.reduced, (
            f"{method} {wire}: counted {counted}, sent {transport.sent} + "
            f"all-reduced {transport.reduced}"
        )
        totals = world.allreduce(np.array([transport.sent, transport.received]))
        assert totals[0] == totals[1], f"{method} {wire}: sent {totals[0]}, received {totals[1]}"
        everyone = world.allgather(result.numpy().tobytes())
        assert all(blob == everyone[0] for blob in everyone), f"{method} {wire}: ranks disagree"


for method in compressors.available():
    for wire in WIRES:
        for numel, density in [(2003, 0.01), (30011, 0.05), (257, 1.0)]:
            check(method, wire, numel, density)
world.Barrier()
if rank == 0:
    print(f"bytes counted = bytes sent on {workers} ranks", flush=True)
