"""``dense``: the uncompressed baseline, one library all-reduce of the whole gradient / P.

At a 16-bit wire the library all-reduce (float32 only) is replaced by the same two halves run
here, with 16-bit messages: a reduce-scatter by split-and-reduce (``allreducers.rotation``) and a
Bruck all-gather of the reduced regions; the values quantization removed stay in a residual.
"""

from __future__ import annotations

import torch

from allreducers import allgather_regions, bruck_allgather_schedule, rotation_schedule, run_schedule

from .base import Synchronizer
from .registry import register
from .sparse_ops import equal_cuts

__all__ = ["Dense"]


@register("dense", description="MPI Allreduce (sum) of the whole gradient divided by P")
class Dense(Synchronizer):
    """MPI Allreduce (sum) of the whole gradient divided by P; no residual at fp32.

    The division is fused into the copy an out-of-place all-reduce makes (docs/DESIGN.md, The
    baselines). At a 16-bit wire: reduce-scatter and all-gather with 16-bit messages and a
    residual (module docstring).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: ignored: every entry is sent.
        dense_warmup: accepted as every method's (every call is dense anyway).
        wire: see :class:`Synchronizer`.
    """

    uses_residual = False
    max_numel = None  # no indices travel

    def __init__(
        self,
        comm,
        numel: int,
        density: float = 1.0,
        dense_warmup: int = 0,
        wire: str = "fp32",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        # A 16-bit wire loses what quantization removes: it goes to a residual.
        self.uses_residual = self.codec.compact
        self.boundaries = equal_cuts(numel, self.size)
        members = list(range(self.size))
        self.scatter_steps = rotation_schedule(self.rank, members)
        self.gather_steps = bruck_allgather_schedule(self.rank, members)

    @property
    def effective_density(self) -> float:
        """Every entry (1.0), whatever ``density`` says."""
        return 1.0

    def _synchronize(self, accumulated, timer):
        if not self.codec.compact:
            return self._dense_average(accumulated, timer), self._residual
        if self.size == 1:  # nothing travels, nothing is quantized
            with timer("accumulate"):
                result = self._new_result(accumulated.device).copy_(accumulated)
                accumulated.zero_()
            return result, accumulated
        return self._compact_average(accumulated, timer), accumulated

    def _region(self, tensor: torch.Tensor, region: int) -> torch.Tensor:
        return tensor[self.boundaries[region] : self.boundaries[region + 1]]

    def _size(self, region: int) -> int:
        return self.boundaries[region + 1] - self.boundaries[region]

    def _compact_average(self, accumulated, timer) -> torch.Tensor:
        """Reduce-scatter and all-gather with 16-bit messages (module docstring).

        ``accumulated`` becomes the residual: at other regions what the wire took off the sent
        values, at this rank's region what it took off the reduced sums, which gather there.
        Each region is coded once (:meth:`Codec.encode_region`) and forwarded as it arrived.
        """
        coder, rank = self.codec, self.rank
        own, own_size = self._region(accumulated, rank), [self._size(rank)]

        def send_region(step):
            with timer("select"):
                region = self._region(accumulated, step.send_items[0])
                return coder.encode_region(region, residual=True)

        def add_region(step, message):
            with timer("accumulate"):
                coder.decode_region(coder.split_regions(message, own_size)[0], own, add=True)

        device = accumulated.device
        run_schedule(
            self.transport,
            self.scatter_steps,
            send_region,
            add_region,
            device,
            timer,
            dtype=coder.recv_dtype,
        )
        with timer("select"):
            message = coder.encode_region(own, residual=True)
        sizes = [self._size(item) for item in range(self.size)]
        coded = allgather_regions(
            self.transport, self.gather_steps, coder, rank, message, sizes, timer
        )
        with timer("accumulate"):
            result = self._new_result(device)
            for item, region in coded.items():
                coder.decode_region(region, self._region(result, item))
            return result.div_(self.size)
