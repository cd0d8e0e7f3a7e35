"""The torch.distributed transport: the same schedules over Gloo (CPU) or NCCL (CUDA).

torch.distributed has no probe, so a message of a size the receiver cannot know is preceded by a
one-element length header. The header is framing, not payload: it is not counted, so traffic
accounting stays identical to the MPI and in-process transports.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ..wire import device_tensor
from .base import Capabilities, PostedReceive, Transport

__all__ = ["TorchDistributedTransport"]


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
