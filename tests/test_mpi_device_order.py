"""The MPI transport hands device memory to a CUDA-aware MPI only once its stream is idle.

MPI knows nothing of CUDA streams: it reads a send's buffer, and writes a receive's, as soon as
it is handed them. These tests run the transport's direct device path on the CPU: tensors on
the ``meta`` device stand for device tensors, a recording stream stands for the CUDA stream and
a recording communicator for MPI, and the log shows what MPI was handed after which wait.
"""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from allreducers.transports import mpi as mpi_transport

DEVICE = torch.device("meta")


class Stream:
    """A stream whose waits go to the log."""

    def __init__(self, log: list) -> None:
        self.log = log

    def synchronize(self) -> None:
        self.log.append("wait")


class Message:
    """A matched message of :class:`Comm`: its receive goes to the comm's log."""

    def __init__(self, comm) -> None:
        self.comm = comm

    def Recv(self, buffer) -> None:  # noqa: N802 - mpi4py's name
        self.comm.record("recv")

    def Irecv(self, buffer):  # noqa: N802
        self.comm.record("irecv")
        return Request()


class Request:
    def Wait(self, status=None) -> None:  # noqa: N802
        pass


class Status:
    """Every message holds 8 elements."""

    def Get_count(self, datatype) -> int:  # noqa: N802
        return 8


class Comm:
    """Records what MPI is handed: sends, and receives of announced messages."""

    def __init__(self, log: list) -> None:
        self.log = log

    def record(self, what: str) -> None:
        self.log.append(what)

    def Isend(self, buffer, dest, tag):  # noqa: N802
        self.record("isend")
        return MPI.REQUEST_NULL

    def Irecv(self, buffer, source, tag):  # noqa: N802 - a receive posted without a probe
        self.record("irecv")
        return Request()

    def Mprobe(self, source, tag, status):  # noqa: N802
        return Message(self)

    def Improbe(self, source, tag, status):  # noqa: N802
        return Message(self)


@pytest.fixture
def direct(monkeypatch):
    """A CUDA-aware MPI transport over the recording communicator, and the log."""
    log = []
    stream = Stream(log)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(mpi_transport.MPI, "Status", Status)
    transport = mpi_transport.MPITransport(MPI.COMM_SELF)
    transport.comm, transport.device_buffers_ok = Comm(log), True
    return transport, log


def test_a_round_waits_once_before_mpi_reads_the_sends_or_writes_the_receive(direct):
    transport, log = direct
    handles = [transport.isend(torch.empty(8, device=DEVICE), 0, 0) for _ in range(2)]
    assert log == []  # queued: the kernels writing them may still run
    message = transport.recv(0, 0, torch.float32, DEVICE, numel=8)
    transport.waitall(handles)
    assert log == ["wait", "isend", "isend", "recv"]
    assert message.device == DEVICE and message.numel() == 8
    assert transport.traffic.host_syncs == 1


def test_a_receive_alone_waits_before_mpi_writes_into_device_memory(direct):
    transport, log = direct
    out = torch.empty(8, device=DEVICE)
    assert transport.recv(0, 0, torch.float32, DEVICE, numel=8, out=out) is out
    handle = transport.irecv(0, 1, torch.float32, DEVICE)
    transport.wait_recv(handle)
    assert log == ["wait", "recv", "wait", "irecv"]
    assert transport.traffic.host_syncs == 2


def test_a_receive_of_known_length_is_posted_at_once_on_the_host_only(direct):
    """On the host MPI gets it before the caller's other work; device memory waits as before."""
    transport, log = direct
    host = torch.empty(8)
    handle = transport.irecv(0, 0, torch.float32, torch.device("cpu"), numel=8, out=host)
    assert log == ["irecv"]
    assert transport.wait_recv(handle).data_ptr() == host.data_ptr()
    out = torch.empty(8, device=DEVICE)
    handle = transport.irecv(0, 1, torch.float32, DEVICE, numel=8, out=out)
    assert log == ["irecv"]  # not yet: the device may still run kernels that use ``out``
    assert transport.wait_recv(handle) is out
    assert log == ["irecv", "wait", "recv"]
    assert transport.traffic.host_syncs == 1


def test_host_tensors_never_wait(direct):
    transport, log = direct
    handle = transport.isend(torch.zeros(8), 0, 0)
    transport.recv(0, 0, torch.float32, torch.device("cpu"), numel=8, out=torch.empty(8))
    transport.waitall([handle])
    assert log == ["isend", "recv"]
    assert transport.traffic.host_syncs == 0


class IdleCheckingComm(Comm):
    """Records, whenever MPI is handed a buffer, whether the current CUDA stream was idle."""

    def record(self, what: str) -> None:
        self.log.append(torch.cuda.current_stream().query())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_mpi_is_handed_device_memory_only_once_the_stream_is_idle(monkeypatch):
    log = []
    monkeypatch.setattr(mpi_transport.MPI, "Status", Status)
    transport = mpi_transport.MPITransport(MPI.COMM_SELF)
    transport.comm, transport.device_buffers_ok = IdleCheckingComm(log), True
    device = torch.device("cuda", torch.cuda.current_device())
    square = torch.randn(4096, 4096, device=device)

    def busy():  # kernels that are still running when the call returns
        result = square
        for _ in range(8):
            result = result @ square
        return result

    handle = transport.isend(busy().reshape(-1)[:8], 0, 0)  # written by queued kernels
    busy()  # still running when the receive starts
    message = transport.recv(0, 0, torch.float32, device, numel=8)
    transport.waitall([handle])
    assert log == [True, True] and message.is_cuda
