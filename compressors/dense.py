"""``dense``: the uncompressed baseline, one library all-reduce of the whole gradient, / P."""
from __future__ import annotations

from . import register
from .base import Synchronizer


@register("dense", description="MPI Allreduce (sum) of the whole gradient, divided by P")
class Dense(Synchronizer):
    """MPI Allreduce (sum) of the whole gradient, divided by P. No residual."""

    uses_residual = False
    max_numel = None  # no indices travel

    def __init__(self, comm, numel: int, density: float = 1.0, dense_warmup: int = 0) -> None:
        super().__init__(comm, numel, density, dense_warmup)
        self._nnz = 0

    @property
    def effective_density(self) -> float:
        """Every entry, whatever ``density`` says."""
        return 1.0

    def _synchronize(self, accumulated, timer):
        result, self._nnz = self._dense_average(accumulated, timer)
        return result, self._residual

    def _count_nonzero(self, result):
        return self._nnz  # counted in the division's pass
