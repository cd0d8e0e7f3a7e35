"""The mpi4py transport: ``Isend`` and matched-probe receives on contiguous buffers.

Device tensors are handed to MPI directly when the library is CUDA-aware. Otherwise they are
staged through pinned host buffers: a send's copy to the host is queued without waiting, and the
sends queued since the last wait are handed to MPI together after one wait for the device (at
the next receive, wait or collective: one host synchronization per round, however many messages
the round sends); a received message goes back to the device by a copy that is not waited for.

MPI knows nothing of CUDA streams: a CUDA-aware library reads and writes device memory as soon
as it is handed a buffer, not after the kernels queued before. So direct device sends are queued
the same way and handed to MPI after that one wait, and a direct device receive lands only once
the device is idle: after the round's wait, or after a wait of its own where the round sent
nothing. ``traffic.host_syncs`` counts those waits. Set the environment variable
``SPARDL_CUDA_AWARE_MPI=1`` (or ``0``) to override the detection.
"""

from __future__ import annotations

import os

import torch
from mpi4py import MPI

from .base import Capabilities, PendingSizedReceive, PostedReceive, Transport
from .lifecycle import (  # noqa: F401 - re-exported: the policy's old home
    abort_on_uncaught_exception,
    end_interrupted,
    install_abort_hook,
    report_and_abort,
    require_thread_level,
)

__all__ = [
    "cuda_aware",
    "MPITransport",
    "abort_on_uncaught_exception",
    "end_interrupted",
    "install_abort_hook",
    "report_and_abort",
    "require_thread_level",
]

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

    ``stream``: for a device tensor, the stream that writes ``buffer`` (its copy to the host when
    staged, the kernels that made it when direct); MPI gets it once that stream is done.
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
        bound = comm.Get_attr(MPI.TAG_UB)
        self.capabilities = Capabilities(
            tag_bound=int(bound) if bound is not None else 32767,
            device_memory=self.device_buffers_ok,
            posted_receives=True,
        )
        self._queued: list = []  # device sends not handed to MPI yet (their stream not waited for)
        self._unmatched: list = []  # started receives whose message was not announced yet

    def check_threads(self, what: str) -> None:
        """Raise ``RuntimeError`` unless MPI was started with ``MPI_THREAD_SERIALIZED`` or more."""
        require_thread_level(what=what)

    def _direct(self, device: torch.device) -> bool:
        """Whether MPI reads and writes tensors on ``device`` itself (the host, or CUDA-aware)."""
        return device.type == "cpu" or self.device_buffers_ok

    @staticmethod
    def _buffer(tensor: torch.Tensor):
        data = tensor.numpy() if tensor.device.type == "cpu" else tensor
        return [data, _MPI_TYPES[tensor.dtype]]

    def _isend(self, tensor, dest, tag):
        tensor = tensor.contiguous()
        if tensor.device.type == "cpu":
            self._flush()  # keep MPI's order of one source's messages
            return _Send(tensor, dest, tag, self.comm.Isend(self._buffer(tensor), dest, tag))
        buffer = tensor  # direct: MPI reads it once the kernels that write it are done
        if not self._direct(tensor.device):
            buffer = _pinned(tensor.numel(), tensor.dtype)
            buffer.copy_(tensor, non_blocking=True)
        send = _Send(buffer, dest, tag, stream=torch.cuda.current_stream(tensor.device))
        self._queued.append(send)
        return send

    def _flush(self) -> set:
        """Wait once for the queued sends' streams, then hand the sends to MPI.

        Returns the streams it waited for (empty: nothing was queued).
        """
        streams = {send.stream for send in self._queued}
        if not streams:
            return streams
        for stream in streams:
            stream.synchronize()
        self.traffic.host_syncs += 1
        for send in self._queued:
            send.request = self.comm.Isend(self._buffer(send.buffer), send.dest, send.tag)
        self._queued = []
        return streams

    def _idle(self, device: torch.device, waited: set) -> set:
        """Before MPI writes or reads ``device``'s memory itself: wait for its current stream.

        ``waited``: the streams waited for just now, with no kernel queued since (a wait for one
        of them serves). Nothing for the host, nor for a staged device (MPI then touches only
        pinned host memory). Returns the streams waited for, this one included.
        """
        if device.type == "cpu" or not self._direct(device):
            return waited
        stream = torch.cuda.current_stream(device)
        if stream not in waited:
            stream.synchronize()
            self.traffic.host_syncs += 1
            waited = waited | {stream}
        return waited

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        return self._recv(source, tag, dtype, device, out)

    def _recv(self, source, tag, dtype, device, out=None):
        waited = self._flush()  # before the probe: the peer may wait for these sends
        status = MPI.Status()
        message = self.comm.Mprobe(source=source, tag=tag, status=status)
        count = status.Get_count(_MPI_TYPES[dtype])
        out = out if out is not None and out.numel() == count else None
        self._idle(device, waited)  # after it: the device's work overlaps the message's wait
        landing = self._landing(count, dtype, device, out)
        message.Recv(self._buffer(landing))
        return self._arrived(landing, device, out)

    def _landing(self, numel: int, dtype: torch.dtype, device: torch.device, out=None):
        """Where MPI writes a received message: on ``device``, or a pinned buffer to stage it.

        ``out``: the caller's buffer for it; a staged receive copies into it. The caller has
        made the device idle (:meth:`_idle`) before MPI writes a direct device landing: ``out``,
        or a new buffer, which the caching allocator may take from a tensor that kernels still
        read.
        """
        if not self._direct(device):
            return _pinned(numel, dtype)
        return out if out is not None else torch.empty(numel, dtype=dtype, device=device)

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

    def _match(self, waited: set = frozenset()) -> None:
        """Start, in the order they were started, the receives whose message is announced.

        ``waited``: the streams the caller's :meth:`_flush` waited for just now.
        """
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
            waited = self._idle(receive.device, waited)
            receive.out = self._landing(numel, receive.dtype, receive.device)
            receive.request = message.Irecv(self._buffer(receive.out))
        self._unmatched = waiting

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        """Post a receive of known length on the host now (into ``out`` where given).

        MPI moves a large message only once its receive is posted (a rendezvous), so the data
        can travel while the caller works. A device receive starts when waited for: MPI may
        write device memory only once the device is idle.
        """
        if device.type != "cpu":
            return super()._irecv_sized(source, tag, dtype, device, numel, out)
        landing = out if out is not None else torch.empty(numel, dtype=dtype)
        return PostedReceive(self.comm.Irecv(self._buffer(landing), source, tag), landing)

    def _wait_recv(self, receive):
        if isinstance(receive, PendingSizedReceive):  # on a device: it starts now
            return self._recv_sized(*receive)
        self._match(self._flush())
        if isinstance(receive, PostedReceive):  # into a buffer of the promised length
            status = MPI.Status()
            receive.request.Wait(status)  # a shorter message fills less of it
            return receive.out[: status.Get_count(_MPI_TYPES[receive.out.dtype])]
        if receive.request is None:
            if receive in self._unmatched:
                self._unmatched.remove(receive)
            return self._recv(receive.source, receive.tag, receive.dtype, receive.device)
        receive.request.Wait()
        return self._arrived(receive.out, receive.device)

    def _allreduce_sum_into(self, tensor, out):
        if not self._direct(out.device) or out.data_ptr() == tensor.data_ptr():
            return super()._allreduce_sum_into(tensor, out)
        self._idle(out.device, self._flush())
        self.comm.Allreduce(self._buffer(tensor.contiguous()), self._buffer(out), op=MPI.SUM)
        return out

    def _allreduce_sum(self, tensor):
        waited = self._flush()
        if self._direct(tensor.device):
            self._idle(tensor.device, waited)
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
