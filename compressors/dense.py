"""``dense``: the uncompressed baseline, one library all-reduce of the whole gradient / P."""

from __future__ import annotations

from . import register
from .base import Synchronizer


@register("dense", description="MPI Allreduce (sum) of the whole gradient divided by P")
class Dense(Synchronizer):
    """MPI Allreduce (sum) of the whole gradient divided by P; no residual.

    The division is fused into the copy an out-of-place all-reduce makes (docs/DESIGN.md, The
    baselines).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: ignored: every entry is sent.
        dense_warmup: accepted as every method's (every call is dense anyway).
    """

    uses_residual = False
    max_numel = None  # no indices travel

    def __init__(self, comm, numel: int, density: float = 1.0, dense_warmup: int = 0) -> None:
        super().__init__(comm, numel, density, dense_warmup)

    @property
    def effective_density(self) -> float:
        """Every entry (1.0), whatever ``density`` says."""
        return 1.0

    def _synchronize(self, accumulated, timer):
        return self._dense_average(accumulated, timer), self._residual
