"""The torch.distributed transport: the same schedules over Gloo (CPU) or NCCL (CUDA).

torch.distributed has no probe, so a message of a size the receiver cannot know is preceded by a
one-element length header. The header is framing, not payload: it is not counted, so traffic
accounting stays identical to the MPI and in-process transports.

A schedule's round (:meth:`Transport.start_round`) goes to the library as one group,
``dist.batch_isend_irecv``: under NCCL the operations between two ranks run in the order they
were posted, so a send posted alone before the receive its peer's send needs would wait for a
receive queued behind it, once messages outgrow NCCL's buffers. A round whose receive has no
known length exchanges the length headers as one group first and waits for them (a read of one
number, as every such receive does), then the data as a second group.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ..device import device_tensor
from .base import Capabilities, PostedReceive, Transport

__all__ = ["TorchDistributedTransport"]


class _Works:
    """Works of one group, each waited for once however often this is.

    Gloo's send work blocks on a second wait. The round's receive and its send share one under
    NCCL, whose group gives one work for all its operations.
    """

    __slots__ = ("works",)

    def __init__(self, works) -> None:
        self.works = list(works)

    def wait(self) -> None:
        while self.works:
            self.works.pop(0).wait()


class TorchDistributedTransport(Transport):
    """One rank of a ``torch.distributed`` process group (``None``: the default group)."""

    def __init__(self, group=None) -> None:
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized: call init_process_group first")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.capabilities = Capabilities(
            tag_bound=2**31 - 1,  # Gloo's and NCCL's tags are int32
            device_memory=dist.get_backend(group) == "nccl",
            posted_receives=True,
            grouped_rounds=True,
        )
        self._global = [
            dist.get_global_rank(group, r) if group is not None else r for r in range(self.size)
        ]

    def agreement_device(self) -> torch.device:
        """Where small collectives of this group run: NCCL's on this rank's GPU."""
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _isend(self, tensor, dest, tag):
        header = device_tensor([tensor.numel()], torch.int64, tensor.device)  # no wait
        peer = self._global[dest]
        handles = [
            dist.isend(header, peer, group=self.group, tag=tag),
            dist.isend(tensor, peer, group=self.group, tag=tag),
        ]
        return handles, header, tensor

    def _isend_sized(self, tensor, dest, tag):
        """No length header: the receiver knows the length (no read of it from the device)."""
        handle = dist.isend(tensor, self._global[dest], group=self.group, tag=tag)
        return [handle], None, tensor

    def _recv_sized(self, source, tag, dtype, device, numel, out=None):
        if out is None:
            out = torch.empty(numel, dtype=dtype, device=device)
        dist.recv(out, self._global[source], group=self.group, tag=tag)
        return out

    def _irecv_sized(self, source, tag, dtype, device, numel, out=None):
        """Post a receive of known length on the host now.

        Gloo moves a message only once its receive is posted, so the data then travels while
        the caller works. On a GPU it starts when waited for, as before.
        """
        if torch.device(device).type != "cpu":
            return super()._irecv_sized(source, tag, dtype, device, numel, out)
        if out is None:
            out = torch.empty(numel, dtype=dtype)
        work = dist.irecv(out, self._global[source], group=self.group, tag=tag)
        return PostedReceive(work, out)

    def _wait_recv(self, handle):
        if isinstance(handle, PostedReceive):
            handle.request.wait()
            return handle.out
        return super()._wait_recv(handle)

    def _start_round(self, send, receive):
        """Post the round's send and receive as one group (two: headers, then the data)."""
        if send is None and receive is None:
            return [], None
        if (send is not None and not send.sized) or (receive is not None and receive.numel is None):
            return self._start_framed_round(send, receive)
        ops = []
        if send is not None:
            ops.append(
                dist.P2POp(dist.isend, send.tensor, self._global[send.dest], self.group, send.tag)
            )
        out = None
        if receive is not None:
            out = receive.out
            if out is None:
                out = torch.empty(receive.numel, dtype=receive.dtype, device=receive.device)
            ops.append(
                dist.P2POp(dist.irecv, out, self._global[receive.source], self.group, receive.tag)
            )
        works = dist.batch_isend_irecv(ops)
        if len(works) == len(ops):  # a work per operation (Gloo)
            parts = [_Works([work]) for work in works]
        else:  # one for the group (NCCL)
            parts = [_Works(works)] * len(ops)
        sends = [([parts[0]], None, send.tensor)] if send is not None else []
        return sends, (PostedReceive(parts[-1], out) if receive is not None else None)

    def _start_framed_round(self, send, receive):
        """A round of messages whose lengths travel first: headers, then the data, as groups."""
        ops, header = [], None
        if send is not None:
            header = device_tensor([send.tensor.numel()], torch.int64, send.tensor.device)
            ops.append(
                dist.P2POp(dist.isend, header, self._global[send.dest], self.group, send.tag)
            )
        if receive is not None:
            length = torch.empty(1, dtype=torch.int64, device=receive.device)
            ops.append(
                dist.P2POp(
                    dist.irecv, length, self._global[receive.source], self.group, receive.tag
                )
            )
        for work in dist.batch_isend_irecv(ops):
            work.wait()  # (each once)
        sized = send._replace(sized=True) if send is not None else None
        if receive is not None:
            receive = receive._replace(numel=int(length.item()), out=None)
        sends, posted = self._start_round(sized, receive)
        return [(pair, header, tensor) for pair, _, tensor in sends], posted

    def _recv(self, source, tag, dtype, device):
        peer = self._global[source]
        header = torch.empty(1, dtype=torch.int64, device=device)
        dist.recv(header, peer, group=self.group, tag=tag)
        out = torch.empty(int(header.item()), dtype=dtype, device=device)
        dist.recv(out, peer, group=self.group, tag=tag)
        return out

    def _waitall(self, handles):
        for pair, _, _ in handles:
            for handle in pair:
                handle.wait()

    def _allreduce_sum(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def _barrier(self):
        dist.barrier(group=self.group)

    def abort(self, message: str) -> None:
        """Print ``message`` and end this process; the launcher (torchrun) ends the others."""
        sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
        os._exit(1)
