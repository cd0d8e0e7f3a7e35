"""``gaussiank``: Gaussiank (Shi et al.): a threshold from a Gaussian fit instead of a top-k sort.

One synchronization of worker w, k = max(1, int(n * density)):

1. a = grad + residual; fit a normal distribution to the entries of a (mean mu, standard
   deviation sigma) and start from the threshold t = mu + z sigma that a fraction ``density`` of
   |a| would exceed (z = Phi^-1(1 - density/2)).
2. Count the entries with |a| >= t; while fewer than 3k/4 pass, divide t by ``scale`` (1.02);
   while more than 5k/4 pass, multiply it; at most ``max_loops`` (20) times. S_w = {|a| >= t}.
   At most two passes over the n entries: every threshold the loop can reach is known in
   advance, so after one selection at the lowest of them the loop counts among those only.
3. Residual = a with S_w zeroed (at a 16-bit wire: what quantization removed from S_w's
   values, which then travel quantized).
4. All-gatherv (Bruck, with counts) of the P lists; scatter-add in rank order; / P. The same
   bits on every rank, and nothing is lost: sum_w a_w = P * result + sum_w residual_w.

At density 1 (k = n) everything is selected. The threshold is never below the smallest
positive float, so zeros are not sent. Cost: ceil(log2 P) rounds, 2(P-1)/P sum_w |S_w| words.
"""

from __future__ import annotations

import math
import statistics

import torch

from allreducers import allgather_joined, bruck_allgather_schedule

from .base import Synchronizer, check_int
from .oktopk import THRESHOLD_FLOOR, check_scale
from .registry import register
from .selection import Selector
from .sparse_ops import budget, entries_at_least, put_, scatter_average_joined

__all__ = ["GaussianK"]


@register(
    "gaussiank",
    description="Gaussiank: threshold from a Gaussian fit, adjusted to about k, all-gatherv",
)
class GaussianK(Synchronizer):
    """Gaussian-fit threshold selection with all-gatherv (module docstring).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries kept, in (0, 1].
        scale: the threshold's correction per loop (1.02).
        max_loops: the most corrections per call (20).
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.
    """

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        scale: float = 1.02,
        max_loops: int = 20,
        dense_warmup: int = 0,
        wire: str = "fp32",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        self.scale = check_scale("scale", scale)
        self.max_loops = check_int("max_loops", max_loops, minimum=0)
        self.k = budget(numel, self.density)
        self.everything = self.k >= numel
        self.z = (
            statistics.NormalDist().inv_cdf(1.0 - self.density / 2) if not self.everything else 0.0
        )
        self.gather_steps = bruck_allgather_schedule(self.rank, list(range(self.size)))
        self.selector = Selector()

    def _synchronize(self, accumulated, timer):
        with timer("select"):
            chosen, values = self._select(accumulated)
            if self.codec.compact:
                sent = self.codec.quantize_row(values)
                put_(accumulated, chosen, values - sent)  # what the wire removes stays
                values = sent
            else:
                put_(accumulated, chosen, 0.0)
        indices, values, sizes = allgather_joined(
            self.transport,
            self.gather_steps,
            (chosen, values),
            None,
            timer,
            wire=self.wire,
            span=self.numel,
        )
        with timer("accumulate"):
            result = self._new_result(accumulated.device)
            scatter_average_joined(result, indices, values, sizes, self.size)
        return result, accumulated

    def _select(self, accumulated) -> tuple:
        """Return S_w (module docstring, steps 1-2): ascending int64 indices and their values."""
        if self.everything:
            return torch.arange(self.numel, device=accumulated.device), accumulated.clone()
        # One sum and one dot product (a tenth of torch.std_mean's time on a CPU).
        n = self.numel
        mean = float(accumulated.sum()) / n
        square = float(torch.dot(accumulated, accumulated))
        std = math.sqrt(max(0.0, square - n * mean * mean) / (n - 1)) if n > 1 else 0.0
        if not math.isfinite(mean):
            raise ValueError(
                "gaussiank: the gradient plus residual holds NaN or inf (a diverged gradient?)"
            )
        threshold = mean + self.z * std
        if not (math.isfinite(threshold) and threshold > THRESHOLD_FLOOR):
            threshold = THRESHOLD_FLOOR
        low, high = math.ceil(3 * self.k / 4), 5 * self.k // 4  # the count must reach 3k/4
        chosen, values = self.selector.at_least(accumulated, threshold)
        count = chosen.numel()
        if low <= count <= high or not self.max_loops:
            return chosen, values
        # Every threshold the loop can reach lies between the start and start * or / scale^loops:
        # select once at the lowest of them, then count only among those candidates.
        factor = 1.0 / self.scale if count < low else self.scale
        if factor < 1:
            lowest = threshold
            for _ in range(self.max_loops):  # the same products as the loop below
                lowest = max(lowest * factor, THRESHOLD_FLOOR)
            chosen, values = self.selector.at_least(accumulated, lowest)
        candidates = values.abs()
        for _ in range(self.max_loops):
            if (count >= low) if factor < 1 else (count <= high):
                break
            threshold = max(threshold * factor, THRESHOLD_FLOOR)
            count = int(torch.count_nonzero(candidates >= threshold))
        return entries_at_least(chosen, values, candidates, threshold)
