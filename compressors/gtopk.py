"""``gtopk``: gTop-k (Shi et al., ICDCS'19): a tree merge keeping k entries at every level.

One synchronization of worker w, k = max(1, int(n * density)):

1. a = grad + residual; S_w = the k largest |a| (``Selector.select`` adds and selects in one
   pass), sent as (index, value) pairs; at a 16-bit wire its values are quantized once here.
2. Reduce towards rank 0 along ``allreducers.tree`` (any P: the ranks above the largest power
   of two fold into the lower ones first). Each receiver merges its list with the received one
   (values added at common indices, in a fixed order) and keeps the k largest |values| (ties to
   the lower index); exactly k entries travel in every message.
3. Broadcast rank 0's final list F down the same tree; result = F / P on every rank.
4. Residual (the method's own rule): a with S_w zeroed, except that the own local top-k values
   at indices not in F go back: new residual = a with the indices of S_w that are in F zeroed
   (at a 16-bit wire: set to what quantization removed from them). A merged list is quantized
   again before it is sent up or broadcast; what that removes is lost as a drop is, except at
   the root, which keeps what the broadcast's quantization removes.

**Lost mass.** A partial sum dropped at an inner merge at an index in F is lost (why:
docs/DESIGN.md, section "gTop-k's lost mass"): sum_w a_w - P * result - sum_w residual_w = L,
where L[j] is the sum of the partial sums dropped at j in F. The measurement reports, summed over
every merge of every rank,

- ``lost_mass``: sum of |partial sum| over the dropped partial sums at indices in F (equal to
  ||L||_1 unless two drops at one index have opposite signs, when it is larger);
- ``lost_sum``: the signed sum of the same partial sums, equal to sum_j L[j];
- ``lost_fraction``: ``lost_mass`` over the mass that entered the tree, sum_w sum_{S_w} |a_w|.

Measuring is not part of gTop-k, so it is opt-in and outside the call: with
``measure_loss=True`` each call keeps the partial sums its merges dropped (the lists the cut
produces anyway), and :meth:`GTopK.measure_lost_mass`, called by every rank after ``allreduce``
returned, combines every rank's drops with one all-reduce of these three numbers and adds them to
``stats``. That all-reduce is in none of ``seconds``, ``bytes_sent``, ``messages`` and
``rounds``; a caller that times ``allreduce`` from outside calls it after stopping its clock.
Cost (docs/DESIGN.md, cost table): 2 ceil(log2 P) rounds; at most 2k words per message.
"""

from __future__ import annotations

import torch

from allreducers import binomial_broadcast_schedule, binomial_reduce_schedule, run_schedule

from .base import Synchronizer
from .registry import register
from .selection import Selector
from .sparse_ops import (
    budget,
    first_of_runs,
    is_member,
    put_,
    put_where,
    search_sorted,
    top_of_union,
    union_of_rows,
)

__all__ = ["GTopK"]


@register(
    "gtopk", description="gTop-k: binomial-tree merge keeping the top-k at every level, broadcast"
)
class GTopK(Synchronizer):
    """gTop-k tree merge for any P; its lost mass measured on request (module docstring).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries kept, in (0, 1].
        measure_loss: keep each call's drops so that :meth:`measure_lost_mass` can report
            ``lost_mass``, ``lost_sum`` and ``lost_fraction`` (default False).
        dense_warmup: see :class:`Synchronizer`.
        wire: see :class:`Synchronizer`.
    """

    adds_residual = True  # the selection pass adds the residual (Selector.scan)
    conserves_mass = False  # with 3+ ranks a tree level drops sums; measure_lost_mass reports them

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        measure_loss: bool = False,
        dense_warmup: int = 0,
        wire: str = "fp32",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        if not isinstance(measure_loss, bool):
            raise ValueError(f"measure_loss must be True or False, got {measure_loss!r}")
        self.measure_loss = measure_loss
        self.k = budget(numel, self.density)
        members = list(range(self.size))
        self.reduce_steps = binomial_reduce_schedule(self.rank, members)
        self.broadcast_steps = binomial_broadcast_schedule(self.rank, members)
        self.selector = Selector()
        # What the last call dropped: (final indices F, dropped (indices, sums) lists, S_w's
        # values); nothing before the first sparse call (dense warm-up calls drop nothing).
        self._drops = (torch.empty(0, dtype=torch.long), [], torch.empty(0))
        self._nnz = torch.empty(0)  # the last final list's values

    def _synchronize(self, grad, timer):
        accumulated = self._residual
        with timer("select"):
            chosen, values = self.selector.select(
                accumulated, self.k, addend=grad, key="accumulated"
            )
        coder = self.codec
        lost = None
        if coder.compact and self.size > 1:
            with timer("select"):
                sent = coder.quantize_row(values)
                lost, values = values - sent, sent
        held = [chosen, values]
        dropped = [] if self.measure_loss else None
        root_loss = []

        def produce(step):
            if coder.compact:  # idempotent on a list received or already quantized
                quantized = coder.quantize_row(held[1])
                # Once per column: a list may end in repeats of its last entry (after a tie).
                loss = torch.where(first_of_runs(held[0]), held[1] - quantized, -0.0)
                if not self.rank and not root_loss:  # the root keeps what the broadcast loses
                    root_loss.append((held[0], loss))
                elif self.rank and dropped is not None:  # a merged sum's loss: measured
                    dropped.append((held[0].long(), loss))
                held[1] = quantized
            return coder.encode_rows(held[0].view(1, -1), held[1].view(1, -1), self.numel)

        def received(message):
            columns, values = coder.decode_rows(message, 1, held[1].numel(), self.numel)
            return columns.view(-1), values.view(-1)

        def consume(step, message):
            held[0], held[1] = self._merge(held[0], held[1], *received(message), dropped, timer)

        def replace(step, message):
            held[0], held[1] = received(message)

        for steps, take in ((self.reduce_steps, consume), (self.broadcast_steps, replace)):
            run_schedule(
                self.transport,
                steps,
                produce,
                take,
                accumulated.device,
                timer,
                dtype=coder.recv_dtype,
                recv_numel=lambda step: coder.rows_size(1, held[1].numel(), self.numel),
            )
        final_indices, final_values = held[0].long(), held[1]  # int64 once, for every use below
        with timer("accumulate"):
            result = self._new_result(accumulated.device)
            put_(result, final_indices, final_values / self.size)
            # Where the own selection's entries were passed on, what stays: 0, or what the
            # wire removed; elsewhere their values stay (written back: fixed shapes, no read).
            place = search_sorted(final_indices, chosen).clamp_(max=final_indices.numel() - 1)
            passed_on = final_indices[place] == chosen
            put_where(accumulated, chosen, passed_on, 0.0 if lost is None else lost)
            for indices, loss in root_loss:
                accumulated.index_add_(0, indices.long(), loss)
            self._nnz = final_values * first_of_runs(final_indices)  # counted if asked
        if self.measure_loss:
            self._drops = (final_indices, dropped, values)
        return result, accumulated

    def _merge(self, indices, values, other_indices, other_values, dropped, timer):
        """Return the union of two lists, values added at common indices, cut to the k largest.

        Fixed shapes (``union_of_rows``: 2k places, ``top_of_union``); the union has at least k
        entries. The entries the cut drops are appended to ``dropped`` (unless it is ``None``).
        """
        with timer("accumulate"):
            union, sums, size = union_of_rows(
                torch.stack([indices.long(), other_indices.long()]),
                torch.stack([values, other_values]),
            )
        with timer("select"):
            keep = top_of_union(self.selector, sums, size, values.numel())
            if dropped is not None:  # measurement only: data-dependent sizes are fine here
                lost = torch.arange(union.numel(), device=union.device) < size
                lost[keep] = False
                dropped.append((union[lost], sums[lost]))
            return union[keep], sums[keep]

    def measure_lost_mass(self) -> dict:
        """Return the lost mass of the last call (module docstring), also added to ``stats``.

        A collective: every rank calls it after the same ``allreduce``. Its all-reduce is
        measurement, not gTop-k: the traffic counters are left as the call set them, and nothing
        of it is in ``stats["seconds"]``.

        Raises:
            ValueError: the synchronizer was built without ``measure_loss=True``.
        """
        if not self.measure_loss:
            raise ValueError("gtopk: the lost mass is measured only with measure_loss=True")
        final_indices, dropped, sent_values = self._drops
        totals = torch.zeros(3, dtype=torch.float64)
        for indices, values in dropped:
            lost = values[is_member(final_indices, indices)].double()
            totals[0] += lost.abs().sum().cpu()
            totals[1] += lost.sum().cpu()
        totals[2] = sent_values.double().abs().sum().cpu()
        traffic = self.transport.traffic
        counted = (traffic.bytes_sent, traffic.messages, traffic.rounds)
        self.transport.allreduce_sum_(totals)
        traffic.bytes_sent, traffic.messages, traffic.rounds = counted
        lost_mass, lost_sum, entered = totals.tolist()
        loss = {
            "lost_mass": lost_mass,
            "lost_sum": lost_sum,
            "lost_fraction": lost_mass / entered if entered > 0 else 0.0,
        }
        self._stats.update(loss)
        return loss

    def _count_nonzero(self, result):
        """The non-zeros of the final list, counted only if ``count_nnz``."""
        return torch.count_nonzero(self._nnz) if self.count_nnz else None
