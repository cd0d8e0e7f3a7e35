"""The mpi4py transport: ``Isend`` and matched-probe receives on contiguous buffers.

Device tensors are handed to MPI directly when the library is CUDA-aware; otherwise they are
staged through pinned host buffers that are kept and reused across calls. Set the environment
variable ``SPARDL_CUDA_AWARE_MPI=1`` (or ``0``) to override the detection.
"""

from __future__ import annotations

import os

import torch
from mpi4py import MPI

from .base import Transport
from .lifecycle import (  # noqa: F401 - the policy's old home: callers import it from here
    abort_on_uncaught_exception,
    end_interrupted,
    install_abort_hook,
    report_and_abort,
    require_thread_level,
)

_MPI_TYPES = {
    torch.int32: MPI.INT32_T,
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.int64: MPI.INT64_T,
    torch.uint8: MPI.BYTE,
}


def cuda_aware() -> bool:
    """Return whether the MPI library accepts CUDA device buffers."""
    override = os.environ.get("SPARDL_CUDA_AWARE_MPI")
    if override is not None:
        return override not in ("", "0", "false", "no")
    query = getattr(MPI, "Query_cuda_support", None)
    return bool(query()) if query is not None else False


class _PinnedPool:
    """Host staging buffers for device tensors, grown on demand and reused across calls."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def get(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Return a host buffer of ``numel`` elements of ``dtype`` for staging slot ``slot``."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        while len(self._buffers) <= slot:
            self._buffers.append(torch.empty(0, dtype=torch.uint8))
        if self._buffers[slot].numel() < nbytes:
            self._buffers[slot] = torch.empty(
                max(nbytes, 2 * self._buffers[slot].numel()),
                dtype=torch.uint8,
                pin_memory=torch.cuda.is_available(),
            )
        return self._buffers[slot][:nbytes].view(dtype)


class _Receive:
    """A receive of :meth:`MPITransport.irecv`: ``request`` and ``out`` once it is matched."""

    __slots__ = ("source", "tag", "dtype", "device", "request", "out")

    def __init__(self, source, tag, dtype, device) -> None:
        self.source, self.tag, self.dtype, self.device = source, tag, dtype, device
        self.request = self.out = None


class MPITransport(Transport):
    """One rank of an ``mpi4py`` communicator.

    Creating one makes an uncaught exception abort the job (:func:`abort_on_uncaught_exception`,
    installed by :func:`~allreducers.transports.lifecycle.install_abort_hook`) unless the program
    installed an exception hook of its own: a rank that dies in the middle of
    a collective would otherwise leave the others waiting forever.
    """

    def __init__(self, comm: MPI.Comm) -> None:
        super().__init__()
        install_abort_hook(comm)  # a program's own exception hook stays
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.device_buffers_ok = cuda_aware()
        self._staging = _PinnedPool()
        self._recv_staging = _PinnedPool()
        self._busy_slots: set = set()  # staging slots of sends not yet waited for
        self._unmatched: list = []  # started receives whose message was not announced yet

    def _host_view(self, tensor: torch.Tensor, slot: int) -> torch.Tensor:
        if tensor.device.type == "cpu" or self.device_buffers_ok:
            return tensor
        host = self._staging.get(slot, tensor.numel(), tensor.dtype)
        host.copy_(tensor)
        return host

    @staticmethod
    def _buffer(tensor: torch.Tensor):
        data = tensor.numpy() if tensor.device.type == "cpu" else tensor
        return [data, _MPI_TYPES[tensor.dtype]]

    def _isend(self, tensor, dest, tag):
        slot = next(s for s in range(len(self._busy_slots) + 1) if s not in self._busy_slots)
        self._busy_slots.add(slot)
        staged = self._host_view(tensor.contiguous(), slot)
        return self.comm.Isend(self._buffer(staged), dest=dest, tag=tag), staged, slot

    def _recv(self, source, tag, dtype, device):
        status = MPI.Status()
        message = self.comm.Mprobe(source=source, tag=tag, status=status)
        numel = status.Get_count(_MPI_TYPES[dtype])
        direct = device.type == "cpu" or self.device_buffers_ok
        out = (
            torch.empty(numel, dtype=dtype, device=device)
            if direct
            else self._recv_staging.get(0, numel, dtype)
        )
        message.Recv(self._buffer(out))
        return out if direct else out.to(device)

    def _waitall(self, handles):
        MPI.Request.Waitall([request for request, _, _ in handles])
        self._busy_slots.difference_update(slot for _, _, slot in handles)

    def _irecv(self, source, tag, dtype, device):
        """Start a receive whose data moves as soon as its message is announced.

        Every ``irecv`` and ``wait_recv`` matches the announced messages of the started receives
        (a non-blocking probe, then a non-blocking receive into a buffer of the message's size).
        Staged device receives are done when waited for (they share one staging buffer).
        """
        receive = _Receive(source, tag, dtype, device)
        if device.type == "cpu" or self.device_buffers_ok:
            self._unmatched.append(receive)
            self._match()
        return receive

    def _match(self) -> None:
        """Start, in the order they were started, the receives whose message is announced."""
        waiting, missed = [], set()
        for receive in self._unmatched:
            status = MPI.Status()
            key = (receive.source, receive.tag)
            message = (
                None
                if key in missed
                else self.comm.Improbe(source=key[0], tag=key[1], status=status)
            )
            if message is None:  # a later receive of the same source and tag must not overtake
                missed.add(key)
                waiting.append(receive)
                continue
            receive.out = torch.empty(
                status.Get_count(_MPI_TYPES[receive.dtype]),
                dtype=receive.dtype,
                device=receive.device,
            )
            receive.request = message.Irecv(self._buffer(receive.out))
        self._unmatched = waiting

    def _wait_recv(self, receive):
        self._match()
        if receive.request is None:
            if receive in self._unmatched:
                self._unmatched.remove(receive)
            return self._recv(receive.source, receive.tag, receive.dtype, receive.device)
        receive.request.Wait()
        return receive.out

    def _allreduce_sum_into(self, tensor, out):
        direct = out.device.type == "cpu" or self.device_buffers_ok
        if not direct or out.data_ptr() == tensor.data_ptr():
            return super()._allreduce_sum_into(tensor, out)
        self.comm.Allreduce(self._buffer(tensor.contiguous()), self._buffer(out), op=MPI.SUM)
        return out

    def _allreduce_sum(self, tensor):
        staged = self._host_view(tensor, 0)
        self.comm.Allreduce(MPI.IN_PLACE, self._buffer(staged), op=MPI.SUM)
        return tensor if staged is tensor else tensor.copy_(staged)

    def _barrier(self):
        self.comm.Barrier()

    def abort(self, message: str) -> None:
        """Print ``message`` and end every rank of the communicator with exit status 1."""
        report_and_abort(self.comm, message.rstrip() + "\n")
