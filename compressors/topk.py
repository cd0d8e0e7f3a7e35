"""``topk`` (alias ``topkA``): local top-k with error feedback, all-gather, scatter-add, / P.

One synchronization of worker w (Aji & Heafield 2017; the TopkA baseline of Ok-Topk and SparDL):

1. a = grad + residual; S_w = the k = max(1, int(n * density)) largest |a|, taken out of a
   (``Selector.take``: the addition runs in the selection pass, both timed as "select").
2. The new residual is a with S_w zeroed.
3. Bruck all-gather (ceil(log2 P) rounds) of the P lists of exactly k (index, value) pairs;
   sizes are known, so fp32 messages carry no counts: every rank sends and receives exactly
   k (P-1) entries, 2k(P-1) words. At a 16-bit wire the sent values are the quantized ones
   and the residual keeps what quantization removed (docs/DESIGN.md, section "The wire").
4. result = the P lists scatter-added in rank order, / P: the same bits on every rank, up to
   P*k non-zeros. Nothing is lost: sum_w a_w = P * result + sum_w residual_w.
"""

from __future__ import annotations

from allreducers import allgather_joined, bruck_allgather_schedule

from .base import Synchronizer
from .registry import register
from .selection import Selector
from .sparse_ops import budget, put_, scatter_average_joined

__all__ = ["TopK"]


@register("topk", "topkA", description="TopkA: local top-k, all-gather of indices and values, / P")
class TopK(Synchronizer):
    """Local top-k with error feedback; every rank all-gathers every rank's k entries.

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries kept, in (0, 1].
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.
    """

    adds_residual = True  # the selection pass adds the residual (Selector.scan)

    def __init__(
        self, comm, numel: int, density: float, dense_warmup: int = 0, wire: str = "fp32"
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        self.k = budget(numel, self.density)
        self.gather_steps = bruck_allgather_schedule(self.rank, list(range(self.size)))
        self.selector = Selector()

    def _synchronize(self, grad, timer):
        accumulated = self._residual
        with timer("select"):
            chosen, values = self.selector.take(accumulated, self.k, addend=grad, key="accumulated")
            if self.codec.compact:  # quantized as a row: no read, exact on the wire
                sent = self.codec.quantize_row(values)
                put_(accumulated, chosen, values - sent)  # what the wire removes stays
                values = sent
        indices, values, sizes = allgather_joined(
            self.transport,
            self.gather_steps,
            (chosen, values),
            self.k,
            timer,
            wire=self.wire,
            span=self.numel,
            buffers=self.messages,
        )
        with timer("accumulate"):
            result = self._new_result(accumulated.device)
            scatter_average_joined(result, indices, values, sizes, self.size)
        return result, accumulated
