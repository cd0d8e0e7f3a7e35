"""``oktopk``: Ok-Topk (Li & Hoefler, PPoPP'22), threshold selection and balanced split-and-reduce.

One synchronization of worker w (call number c of this synchronizer, dense warm-up calls not
counted), k = max(1, int(n * density)):

1. **Local selection.** a = grad + residual, added in the selection's pass. If c %
   ``local_interval`` == 0 the local threshold is exact: S_w = the k largest |a|
   (``Selector.select``) and the threshold becomes the k-th largest |a|. Otherwise the previous
   threshold is reused: S_w = {j : |a_j| >= threshold} (``Selector.at_least``, one pass, no
   sort); while more than 4k/3 entries pass it is raised x
   ``raise_scale`` (1.03), at most ``raise_limit`` (5) times (the counts after a raise look
   only at the entries that passed before it: one pass over the n entries in all).
2. **Regions.** If c % ``region_interval`` == 0 the index space is re-split into P contiguous
   regions holding about equal numbers of selected entries: each worker proposes the P-1 cut
   points that split its sorted S_w evenly; one integer all-reduce averages them.
3. **Split-and-reduce** (``allreducers.rotation``): in step j = 1..P-1 worker r sends its
   entries of region r+j to r+j and receives its own region's entries from r-j; the owner adds
   them (own entries first, then in step order) into its region. As the authors run it, up to
   ``in_flight`` (4) steps travel at once (``allreducers.run_windowed``): each received region
   is added while the next steps' messages travel; the sums are those of one step at a time,
   to the bit. Afterwards: if fewer than 2k/3
   entries were selected the local threshold is divided by ``local_scale`` (1.012), if more
   than 5k/4 it is multiplied (for the next call).
4. **Global selection.** The candidates of region r are the indices anyone sent there. If
   c % ``global_interval`` == 0 every owner all-gathers all its candidates and every rank keeps
   the exact global top-k of the union; the global threshold becomes the k-th largest
   |reduced value|. Otherwise each owner keeps its candidates with |value| >= global threshold
   and only those are all-gathered (Bruck, with counts: all-gatherv); afterwards the threshold
   is multiplied by ``global_scale`` (1.008) if more than 4k/3 entries were kept in total, and
   divided by it if fewer than 2k/3.
5. result = the kept entries / P (the same bits on every rank). ``stats`` add ``selected``
   (|S_w|) and ``kept`` (entries in the result) to the common fields.
6. Residual: a with the indices that w selected *and* that were kept zeroed. At every kept
   index the result holds exactly the values of the workers that selected it, and everything
   else stays in residuals: sum_w a_w = P * result + sum_w residual_w (mass is conserved).
   At a 16-bit wire (docs/DESIGN.md, section "The wire") a sender's kept index holds what
   quantization removed from the value it sent, and an owner adds to its residual at its kept
   indices what quantization removed from the sums it all-gathered.

At density 1 (k = n) every threshold is 0: all entries are selected and kept, which gives the
dense average. Thresholds are never below the smallest positive float on reuse calls, so zeros
are never sent. Cost (docs/DESIGN.md, cost table): (P-1) + ceil(log2 P) rounds, plus
2 ceil(log2 P) for the boundary all-reduce; on calls that reuse both thresholds about
2(P-1)/P (|S_w| + kept) words.
"""

from __future__ import annotations

import math
import numbers

import torch

from allreducers import RegionReducer, allgather_joined, bruck_allgather_schedule, device_tensor

from .base import Synchronizer, check_int
from .registry import register
from .selection import Selector
from .sparse_ops import budget, entries_at_least, equal_cuts, is_member, put_, put_where

__all__ = ["THRESHOLD_FLOOR", "check_scale", "OkTopK"]

#: The smallest threshold Ok-Topk (and GaussianK) selects with: float32's smallest normal number.
THRESHOLD_FLOOR = float(torch.finfo(torch.float32).tiny)


def check_scale(name: str, value) -> float:
    """Return ``value`` as a float; ``ValueError`` unless it is a finite number > 1.

    Python's and NumPy's numbers count; a bool does not. ``name`` names it in the message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 1.0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 1, got {value!r}")
    return float(value)


@register(
    "oktopk",
    description=(
        "Ok-Topk: reused thresholds, balanced split-and-reduce, global threshold, all-gatherv"
    ),
)
class OkTopK(Synchronizer):
    """Ok-Topk with the authors' intervals and scales as options (module docstring).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries kept, in (0, 1].
        local_interval: calls between exact local thresholds (32).
        global_interval: calls between exact global thresholds (32).
        region_interval: calls between region re-splits (64).
        raise_scale: the raise of a reused local threshold that lets more than 4k/3 entries
            pass (1.03).
        raise_limit: at most that many raises per call (5).
        local_scale: the per-call correction of the local threshold (1.012).
        global_scale: the per-call correction of the global threshold (1.008).
        in_flight: split-and-reduce exchanges travelling at once, at most P-1 (4; 1: one
            blocking exchange per step).
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.

    Raises:
        ValueError: an option out of range.
    """

    adds_residual = True  # the local selection's pass adds the residual

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        local_interval: int = 32,
        global_interval: int = 32,
        region_interval: int = 64,
        raise_scale: float = 1.03,
        raise_limit: int = 5,
        local_scale: float = 1.012,
        global_scale: float = 1.008,
        in_flight: int = 4,
        dense_warmup: int = 0,
        wire: str = "fp32",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        self.local_interval = check_int("local_interval", local_interval)
        self.global_interval = check_int("global_interval", global_interval)
        self.region_interval = check_int("region_interval", region_interval)
        self.raise_limit = check_int("raise_limit", raise_limit, minimum=0)
        self.raise_scale = check_scale("raise_scale", raise_scale)
        self.local_scale = check_scale("local_scale", local_scale)
        self.global_scale = check_scale("global_scale", global_scale)
        self.in_flight = check_int("in_flight", in_flight)
        self.k = budget(numel, self.density)
        self.everything = self.k >= numel
        self.step = 0
        self.local_threshold = 0.0
        self.global_threshold = 0.0
        self.boundaries = equal_cuts(numel, self.size)
        self.gather_steps = bruck_allgather_schedule(self.rank, list(range(self.size)))
        self.reducer = RegionReducer(self.transport, self.in_flight, wire)
        self.selector = Selector()
        self._nnz = 0
        self._counts = {}

    @property
    def kind_period(self) -> int:
        """Calls after which the pattern of exact calls and region re-splits repeats."""
        return math.lcm(self.local_interval, self.region_interval, self.global_interval)

    def call_kind(self, step: int) -> tuple:
        """Return whether call ``step`` has an exact local threshold, a re-split, an exact global.

        The module docstring's steps 1, 2 and 4.
        """
        return (
            step % self.local_interval == 0,
            step % self.region_interval == 0,
            step % self.global_interval == 0,
        )

    def _synchronize(self, grad, timer):
        k = self.k
        exact_local, resplit, exact_global = self.call_kind(self.step)
        accumulated = self._residual
        with timer("select"):
            chosen, values = self._select_local(accumulated, grad, exact_local)
        if resplit:
            self.boundaries = self._balanced_boundaries(chosen, timer)
        count = chosen.numel()
        if count < 2 * k / 3:
            self.local_threshold /= self.local_scale
        elif count > 5 * k / 4:
            self.local_threshold *= self.local_scale
        candidates, sums = self.reducer.reduce(chosen, values, self.boundaries, timer)
        owned_loss = []
        kept_indices, kept_values = self._select_global(
            candidates, sums, exact_global, timer, owned_loss
        )
        with timer("accumulate"):
            result = self._new_result(accumulated.device)
            kept_indices = kept_indices.long()  # once for both writes
            put_(result, kept_indices, kept_values / self.size)
            # No boolean mask (a read on a GPU); -0.0 added below changes no bit.
            passed_on = is_member(kept_indices, chosen)
            lost = self.reducer.lost
            put_where(accumulated, chosen, passed_on, 0.0 if lost is None else lost)
            for indices, loss in owned_loss:  # what the wire took off this owner's kept sums
                indices = indices.long()
                kept = is_member(kept_indices, indices)
                accumulated.index_add_(0, indices, torch.where(kept, loss, -0.0))
            self._nnz = kept_values
        self._counts = {"selected": count, "kept": kept_values.numel()}
        self.step += 1
        return result, accumulated

    def _select_local(self, accumulated, grad, exact: bool) -> tuple:
        """Return S_w (module docstring, step 1): ascending int64 indices and their values.

        ``grad`` is first added into ``accumulated`` (the residual) to form a.
        """
        if self.everything:
            accumulated.add_(grad)
            return torch.arange(self.numel, device=accumulated.device), accumulated.clone()
        if exact:
            chosen, values = self.selector.select(accumulated, self.k, addend=grad)
            self.local_threshold = float(values.abs().min())
            return chosen, values
        threshold = max(self.local_threshold, THRESHOLD_FLOOR)
        chosen, values = self.selector.at_least(accumulated, threshold, addend=grad)
        count = chosen.numel()
        if count > 4 * self.k // 3 and self.raise_limit:
            # A raised threshold only removes entries: count among those that passed already.
            passed = values.abs()
            for _ in range(self.raise_limit):
                if count <= 4 * self.k // 3:
                    break
                threshold *= self.raise_scale
                count = int(torch.count_nonzero(passed >= threshold))
            chosen, values = entries_at_least(chosen, values, passed, threshold)
        self.local_threshold = threshold
        return chosen, values

    def _balanced_boundaries(self, chosen: torch.Tensor, timer) -> list:
        """Return region boundaries [0, c_1, ..., c_(P-1), n]: every rank's proposal averaged."""
        workers, count = self.size, chosen.numel()
        if workers == 1:
            return [0, self.numel]
        if count:
            picks = [part * count // workers for part in range(1, workers)]
            picks = device_tensor(picks, torch.int64, chosen.device)
            proposal = chosen.index_select(0, picks).to(torch.int64)
        else:
            proposal = device_tensor(
                equal_cuts(self.numel, workers)[1:-1], torch.int64, chosen.device
            )
        with timer("comm"):
            total = self.transport.allreduce_sum_(proposal)
        return [0] + (total // workers).tolist() + [self.numel]

    def _select_global(self, candidates, sums, exact: bool, timer, owned_loss: list) -> tuple:
        """Return the kept (int32 indices, values), the same on every rank (module docstring, 4).

        At a 16-bit wire the own list travels quantized; ``owned_loss`` then receives its
        (indices, what quantization removed).
        """
        if exact or self.everything:
            own = (candidates, sums)
        else:
            with timer("select"):
                mine = self.selector.above(sums.abs(), max(self.global_threshold, THRESHOLD_FLOOR))
                own = (candidates.index_select(0, mine), sums.index_select(0, mine))
        if self.codec.compact and self.size > 1:
            with timer("select"):
                sent = self.codec.quantize_row(own[1])
                owned_loss.append((own[0], own[1] - sent))
                own = (own[0], sent)
        indices, values, _ = allgather_joined(
            self.transport, self.gather_steps, own, None, timer, wire=self.wire, span=self.numel
        )
        kept = values.numel()
        if exact and not self.everything:
            if kept > self.k:
                with timer("select"):
                    keep = self.selector.topk(values, self.k)
                    indices, values = indices.index_select(0, keep), values.index_select(0, keep)
            if values.numel():
                self.global_threshold = float(values.abs().min())
        elif not self.everything:
            if kept > 4 * self.k / 3:
                self.global_threshold *= self.global_scale
            elif kept < 2 * self.k / 3:
                self.global_threshold /= self.global_scale
        return indices, values

    def _count_nonzero(self, result):
        return torch.count_nonzero(self._nnz) if self.count_nnz else None

    def _after_call(self) -> None:
        if self.calls > self.dense_warmup:
            self._stats.update(self._counts)

    def _extra_state(self) -> dict:
        return {
            "step": self.step,
            "local_threshold": self.local_threshold,
            "global_threshold": self.global_threshold,
            "boundaries": list(self.boundaries),
        }

    def _load_extra_state(self, state: dict) -> None:
        self.step = int(state["step"])
        self.local_threshold = float(state["local_threshold"])
        self.global_threshold = float(state["global_threshold"])
        self.boundaries = [int(b) for b in state["boundaries"]]
