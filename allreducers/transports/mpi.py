"""The mpi4py transport: ``Isend`` and matched-probe receives on contiguous buffers.

Device tensors are handed to MPI directly when the library is CUDA-aware. Otherwise they are
staged through pinned host buffers: a send's copy to the host is queued without waiting, and the
sends queued since the last wait are handed to MPI together after one wait for the device (at
the next receive, wait or collective: one host synchronization per round, however many messages
the round sends); a received message goes back to the device by a copy that is not waited for.
``traffic.host_syncs`` counts those waits. Set the environment variable
``SPARDL_CUDA_AWARE_MPI=1`` (or ``0``) to override the detection.
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


def _pinned(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A host buffer for staging, from torch's caching allocator of pinned memory.

    That allocator hands a block out again only once the non-blocking copies recorded on it are
    done (it asks the device, it does not wait for it), so a staged receive needs no host
    synchronization before its buffer is reused.
    """
    return torch.empty(numel, dtype=dtype, pin_memory=True)


class _Send:
    """A send of :meth:`MPITransport.isend`: ``request`` once MPI has it, ``buffer`` kept alive.

    ``stream``: for a staged send, the stream its copy to the host was queued on.
    """

    __slots__ = ("request", "buffer", "dest", "tag", "stream")

    def __init__(self, buffer, dest, tag, request=None, stream=None) -> None:
        self.buffer, self.dest, self.tag, self.request = buffer, dest, tag, request
        self.stream = stream


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
        self._queued: list = []  # staged sends whose copy to the host is not waited for yet
        self._unmatched: list = []  # started receives whose message was not announced yet

    def _direct(self, device: torch.device) -> bool:
        """Whether MPI reads and writes tensors on ``device`` itself (the host, or CUDA-aware)."""
        return device.type == "cpu" or self.device_buffers_ok

    @staticmethod
    def _buffer(tensor: torch.Tensor):
        data = tensor.numpy() if tensor.device.type == "cpu" else tensor
        return [data, _MPI_TYPES[tensor.dtype]]

    def _isend(self, tensor, dest, tag):
        tensor = tensor.contiguous()
        if self._direct(tensor.device):
            self._flush()  # keep MPI's order of one source's messages
            return _Send(tensor, dest, tag, self.comm.Isend(self._buffer(tensor), dest, tag))
        host = _pinned(tensor.numel(), tensor.dtype)
        host.copy_(tensor, non_blocking=True)
        send = _Send(host, dest, tag, stream=torch.cuda.current_stream(tensor.device))
        self._queued.append(send)
        return send

    def _flush(self) -> None:
        """Wait once for the queued copies to the host, then hand their sends to MPI."""
        if not self._queued:
            return
        for stream in {send.stream for send in self._queued}:
            stream.synchronize()
        self.traffic.host_syncs += 1
        for send in self._queued:
            send.request = self.comm.Isend(self._buffer(send.buffer), send.dest, send.tag)
        self._queued = []

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        return self._recv(source, tag, dtype, device, out)

    def _recv(self, source, tag, dtype, device, out=None):
        self._flush()
        status = MPI.Status()
        message = self.comm.Mprobe(source=source, tag=tag, status=status)
        count = status.Get_count(_MPI_TYPES[dtype])
        out = out if out is not None and out.numel() == count else None
        landing = self._landing(count, dtype, device, out)
        message.Recv(self._buffer(landing))
        return self._arrived(landing, device, out)

    def _landing(self, numel: int, dtype: torch.dtype, device: torch.device, out=None):
        """Where MPI writes a received message: on ``device``, or a pinned buffer to stage it.

        ``out``: the caller's buffer for it, written by MPI on the host; on a GPU it is only
        the staged copy's target, as MPI's own writes to device memory are not ordered with
        the kernels still reading the buffer's last message.
        """
        if out is not None and out.device.type == "cpu":
            return out
        if self._direct(device):
            return torch.empty(numel, dtype=dtype, device=device)
        return _pinned(numel, dtype)

    def _arrived(self, landing: torch.Tensor, device: torch.device, out=None) -> torch.Tensor:
        """The received message on ``device``: a staged one copied there, not waited for."""
        if self._direct(device):
            return landing
        if out is not None:
            return out.copy_(landing, non_blocking=True)
        return landing.to(device, non_blocking=True)

    def _waitall(self, handles):
        self._flush()
        MPI.Request.Waitall([send.request for send in handles])

    def _irecv(self, source, tag, dtype, device):
        """Start a receive whose data moves as soon as its message is announced.

        Every ``irecv`` and ``wait_recv`` matches the announced messages of the started receives
        (a non-blocking probe, then a non-blocking receive into a buffer of the message's size).
        A staged device receive lands in a pinned buffer and is copied to the device when
        waited for.
        """
        receive = _Receive(source, tag, dtype, device)
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
            numel = status.Get_count(_MPI_TYPES[receive.dtype])
            receive.out = self._landing(numel, receive.dtype, receive.device)
            receive.request = message.Irecv(self._buffer(receive.out))
        self._unmatched = waiting

    def _wait_recv(self, receive):
        self._flush()
        self._match()
        if receive.request is None:
            if receive in self._unmatched:
                self._unmatched.remove(receive)
            return self._recv(receive.source, receive.tag, receive.dtype, receive.device)
        receive.request.Wait()
        return self._arrived(receive.out, receive.device)

    def _allreduce_sum_into(self, tensor, out):
        if not self._direct(out.device) or out.data_ptr() == tensor.data_ptr():
            return super()._allreduce_sum_into(tensor, out)
        self._flush()
        self.comm.Allreduce(self._buffer(tensor.contiguous()), self._buffer(out), op=MPI.SUM)
        return out

    def _allreduce_sum(self, tensor):
        self._flush()
        if self._direct(tensor.device):
            self.comm.Allreduce(MPI.IN_PLACE, self._buffer(tensor), op=MPI.SUM)
            return tensor
        host = _pinned(tensor.numel(), tensor.dtype)
        host.copy_(tensor)  # waits for the device
        self.traffic.host_syncs += 1
        self.comm.Allreduce(MPI.IN_PLACE, self._buffer(host), op=MPI.SUM)
        return tensor.copy_(host, non_blocking=True)

    def _barrier(self):
        self._flush()
        self.comm.Barrier()

    def abort(self, message: str) -> None:
        """Print ``message`` and end every rank of the communicator with exit status 1."""
        report_and_abort(self.comm, message.rstrip() + "\n")
