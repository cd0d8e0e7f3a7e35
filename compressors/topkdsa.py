"""``topkdsa``: TopkDSA, SparCML's dynamic sparse all-reduce on top of a local top-k.

One synchronization of worker w, k = max(1, int(n * density)):

1. a = grad + residual; S_w = the k largest |a|; residual = a with S_w zeroed
   (``Selector.take``: the addition runs in the selection pass).
2. The index space is cut into P equal contiguous regions; split-and-reduce
   (``allreducers.rotation``, P-1 steps) sends every region's entries straight to its owner,
   which adds them (a reduce-scatter).
3. One integer all-reduce gives the total number of reduced entries (the fill-in). If it is
   below ``dense_above`` * n (1/3 by default: the sparse form costs 2 words per entry, the dense
   form 1 per element) the owners all-gather their (index, value) lists (Bruck, with counts:
   all-gatherv); otherwise they all-gather their dense regions.
4. result = everything reduced / P: the same bits on every rank, and nothing is dropped after
   the local selection: sum_w a_w = P * result + sum_w residual_w. At a 16-bit wire
   (docs/DESIGN.md, section "The wire") a sender's residual keeps what quantization removed
   from the values it sent, an owner's what it removed from the sums it all-gathered.

Cost: (P-1) + 3 ceil(log2 P) rounds; about 2(P-1)/P (k + reduced entries) words (sparse case).
"""

from __future__ import annotations

import torch

from allreducers import (
    RegionReducer,
    allgather_joined,
    allgather_regions,
    bruck_allgather_schedule,
    codec,
    device_tensor,
)

from .base import Synchronizer
from .registry import register
from .selection import Selector
from .sparse_ops import budget, equal_cuts, put_

__all__ = ["TopkDSA"]


@register(
    "topkdsa",
    description="TopkDSA (SparCML): local top-k, reduce-scatter, sparse or dense all-gatherv",
)
class TopkDSA(Synchronizer):
    """Local top-k, reduce-scatter over equal regions, then a sparse or dense all-gather.

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries kept, in (0, 1].
        dense_above: the fill-in (reduced entries over n) from which the final all-gather
            sends dense regions (1/3).
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.

    Raises:
        ValueError: ``dense_above`` outside (0, 1].
    """

    adds_residual = True  # the selection pass adds the residual (Selector.scan)

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        dense_above: float = 1.0 / 3.0,
        dense_warmup: int = 0,
        wire: str = "fp32",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        if (
            isinstance(dense_above, bool)
            or not isinstance(dense_above, (int, float))
            or not 0.0 < dense_above <= 1.0
        ):
            raise ValueError(f"dense_above must be a number in (0, 1], got {dense_above!r}")
        self.dense_above = float(dense_above)
        self.k = budget(numel, self.density)
        self.boundaries = equal_cuts(numel, self.size)
        self.gather_steps = bruck_allgather_schedule(self.rank, list(range(self.size)))
        self.reducer = RegionReducer(self.transport, wire=wire)
        self.selector = Selector()
        self.went_dense = False
        self._nnz = 0

    def _synchronize(self, grad, timer):
        accumulated = self._residual
        with timer("select"):
            chosen, values = self.selector.take(accumulated, self.k, addend=grad, key="accumulated")
        candidates, sums = self.reducer.reduce(chosen, values, self.boundaries, timer)
        if self.reducer.lost is not None:  # the residual keeps what the wire removed
            put_(accumulated, chosen, self.reducer.lost)
        fill_in = device_tensor([candidates.numel()], torch.int64, sums.device)
        with timer("comm"):
            total = int(self.transport.allreduce_sum_(fill_in)[0])
        self.went_dense = total >= self.dense_above * self.numel
        with timer("accumulate"):
            result = self._new_result(accumulated.device)
        if self.went_dense:
            self._gather_dense(result, timer)
        else:
            if self.codec.compact and self.size > 1:
                with timer("select"):
                    sent = self.codec.quantize_row(sums)
                    accumulated.index_add_(0, candidates.long(), sums - sent)
                    sums = sent
            indices, kept, _ = allgather_joined(
                self.transport,
                self.gather_steps,
                (candidates, sums),
                None,
                timer,
                wire=self.wire,
                span=self.numel,
            )
            with timer("accumulate"):
                put_(result, indices.long(), kept / self.size)
                self._nnz = kept
        return result, accumulated

    def _gather_dense(self, result, timer) -> None:
        """All-gather (Bruck) the dense reduced regions straight into ``result``, / P.

        Each region travels as :meth:`Codec.encode_region` codes it (in pieces of 65,536 values
        at a 16-bit wire, each with an exponent of its own) and is forwarded as it arrived.
        """
        bounds = self.boundaries
        coder = self.codec if self.size > 1 else codec("fp32")  # alone: nothing travels
        sums = self.reducer.region_sums(bounds)
        with timer("select"):
            message = coder.encode_region(sums, residual=coder.compact)
            if coder.compact:  # what the wire removes stays with the owner
                self._residual[bounds[self.rank] : bounds[self.rank + 1]].add_(sums)
        sizes = [end - start for start, end in zip(bounds, bounds[1:])]
        coded = allgather_regions(
            self.transport, self.gather_steps, coder, self.rank, message, sizes, timer
        )
        with timer("accumulate"):
            for item, region in coded.items():
                coder.decode_region(region, result[bounds[item] : bounds[item + 1]])
            result.div_(self.size)
            self._nnz = None

    def _count_nonzero(self, result):
        if self._nnz is None:  # dense: a pass over the result
            return super()._count_nonzero(result)
        return torch.count_nonzero(self._nnz) if self.count_nnz else None
