"""``spardl``: SparDL (Zhao et al., arXiv 2304.00737) with global residual collection.

One synchronization of worker w = (team t, position r), teams of m = P/d contiguous ranks:

1. a = grad + residual, zero-padded to m*B (B = ceil(n/m)) and viewed as m blocks. A block gets
   the gradient at its first touch: a cut adds it in the same pass that selects (``Selector.scan``,
   timed as "select"; about half the blocks are first touched by a cut), a receive adds it first.
2. Spar-Reduce-Scatter inside the team (``allreducers.srs``): ceil(log2 m) rounds, one message
   per round (``srs="rounds"``), or the same rounds one block per step, m-1 messages and m-1
   waits (``srs="blocks"``, as the authors' released code runs it; the same bits); each block is
   cut to its top-k_b (k_b = max(1, int(B*density))) right before it is sent. The cut only reads
   the block: a sent block is never touched again, so its dense copy keeps what the cut dropped,
   and the cut's columns are kept to tell what it sent on.
3. The own block r, now summed over the team, is cut to its top-h (h = k_b when d = 1 and for
   R-SAG). With d = 1 that list is final and step 6 sets the residual at all its columns to 0.
4. d > 1 only, Spar-All-Gather among the d workers holding block r (one per team):
   - B-SAG (``sag="bruck"``, any d): Bruck all-gather of their h-entry lists (ceil(log2 d)
     rounds, about (d-1) h entries sent), duplicates summed in team order, the top-k_b of the
     union kept; h adapts so that the union tracks k_b (:class:`HeightAdapter`).
   - R-SAG (``sag="recursive"``, d a power of two): a recursive pairwise reduction of their
     k_b-entry lists (``allreducers.halving``; log2(d) rounds, k_b entries per message). In step
     s the holder of team t pairs with team t XOR d/2^(s+1) (d = 8: 0-4 1-5 2-6 3-7, then 0-2
     1-3 4-6 5-7, then 0-1 2-3 4-5 6-7); partners exchange their current lists, sum them (the
     lower team's list first, so both get the same bits) and keep the top-k_b of the union.
     After step s the 2^(s+1) holders of a group hold the same list, so in step s all of them
     compute the same cut: each keeps 1/2^(s+1) of every dropped value, and together they keep
     it once. In step 0 that is the authors' ``dropped / 2``; their code keeps half in every
     step, which from step 1 on counts a drop 2^s times (it matters from d = 8 on: what the last
     step drops never reaches the final list, see step 6).
5. Bruck all-gather of the m block lists inside the team; result = values / P, unpadded.
6. Global residual collection: at every coordinate present in the result the new residual is what
   this worker's cuts dropped there (0 where its cut sent the entry on, else the block's value
   when it was cut, plus, for R-SAG, its shares of what its pair steps dropped there); elsewhere
   it is this worker's own accumulated value. Summed over the workers this keeps every discarded
   value: sum_w a_w = P*result + sum_w residual_w. For R-SAG: a coordinate c in the final list
   got there through some pairs and was dropped by others; the final value is the sum of the
   teams' lists at c less every drop at c, and the shares of each drop sum to it once, so the
   residuals hold exactly the difference. At a coordinate outside the final list every worker
   keeps its accumulated value, which already holds everything: shares there are discarded.
   Steps 5 and 6 overlap: each block's list is collected while the next lists travel.
"""

from __future__ import annotations

import math
import numbers

import torch

from allreducers import (
    allgather_lists,
    bruck_allgather_schedule,
    pack,
    recursive_halving_schedule,
    run_schedule,
    srs_block_schedule,
    srs_schedule,
    unpack,
)

from . import register
from .base import Synchronizer
from .selection import Selector
from .sparse_ops import flat_nonzero, is_member, put_

SAG_VARIANTS = ("bruck", "recursive")
SRS_EXECUTIONS = {"rounds": srs_schedule, "blocks": srs_block_schedule}


class HeightAdapter:
    """The adaptive per-team selection size h of Spar-All-Gather.

    Starts at k_b/d and moves by ``step`` (initially max(1, (k_b - h)/100)) towards a union of
    k_b entries: it keeps its direction while that is right, doubling the step every second
    time, and reverses with half the step when it overshoots; it stays in [k_b/d, k_b]. With one
    team, or at full density, h is k_b and never changes (nothing may be dropped at density 1).
    """

    def __init__(self, block_budget: int, teams: int, block_size: int) -> None:
        self.block_budget = block_budget
        self.fixed = teams == 1 or block_budget >= block_size
        self.floor = max(1, block_budget // teams)
        self.value = block_budget if self.fixed else self.floor
        self.step = max(1, (block_budget - self.value) // 100)
        self.direction = 0
        self.streak = 0

    def update(self, union_size: int) -> None:
        """Adapt h after a Spar-All-Gather whose coalesced union had ``union_size`` entries."""
        if self.fixed:
            return
        wanted = (union_size < self.block_budget) - (union_size > self.block_budget)
        if wanted == 0:
            self.direction, self.streak = 0, 0
            return
        if wanted == self.direction:
            self.streak += 1
            if self.streak % 2 == 0:
                self.step *= 2
        elif self.direction != 0:
            self.step, self.streak = max(1, self.step // 2), 0
        self.direction = wanted
        self.value = min(self.block_budget, max(self.floor, self.value + wanted * self.step))

    def state_dict(self) -> dict:
        """The adapter's mutable state."""
        return {
            "value": self.value,
            "step": self.step,
            "direction": self.direction,
            "streak": self.streak,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.value, self.step = int(state["value"]), int(state["step"])
        self.direction, self.streak = int(state["direction"]), int(state["streak"])


def _runs(items) -> list:
    """``(first, count)`` of each stretch of consecutive numbers in ``items`` (cyclic block
    lists have at most two).
    """
    runs = []
    for item in items:
        if runs and runs[-1][0] + runs[-1][1] == item:
            runs[-1][1] += 1
        else:
            runs.append([item, 1])
    return [tuple(run) for run in runs]


def _passed_on(
    seen: torch.Tensor, columns: torch.Tensor, cut_columns: torch.Tensor, level: torch.Tensor
) -> torch.Tensor:
    """Mask: which ``columns`` of a block a cut took, given the values there when it cut
    (``seen``), its columns and its k-th largest ``|x|`` (``level``). A cut takes every entry
    above its level and none below, so only entries equal to the level (the last one taken,
    and ties, broken by position) are looked up among its columns.
    """
    magnitude = seen.abs()
    passed_on = magnitude > level
    tied = flat_nonzero(magnitude == level)
    passed_on[tied] = is_member(cut_columns, columns[tied])
    return passed_on


def check_teams(teams, sag: str, workers: int) -> int:
    """``teams`` as an int; ``ValueError`` unless it divides ``workers`` and ``sag`` suits it."""
    divisors = [d for d in range(1, workers + 1) if workers % d == 0]
    if isinstance(teams, bool) or not isinstance(teams, numbers.Integral) or teams not in divisors:
        raise ValueError(
            f"teams={teams!r} must divide the worker count {workers}; "
            f"valid: {', '.join(map(str, divisors))}"
        )
    teams = int(teams)
    if sag not in SAG_VARIANTS:
        raise ValueError(
            f"sag={sag!r} is not a Spar-All-Gather variant; valid: {', '.join(SAG_VARIANTS)}"
        )
    if sag == "recursive" and teams & (teams - 1):
        powers = [d for d in divisors if not d & (d - 1)]
        raise ValueError(
            f"sag='recursive' needs teams a power of two, got {teams}; use sag='bruck' "
            f"or teams in {', '.join(map(str, powers))}"
        )
    return teams


def check_srs(srs) -> str:
    """``srs`` itself; ``ValueError`` unless it names a Spar-Reduce-Scatter execution."""
    if not isinstance(srs, str) or srs not in SRS_EXECUTIONS:
        raise ValueError(
            f"srs={srs!r} is not a Spar-Reduce-Scatter execution; valid: {', '.join(SRS_EXECUTIONS)}"
        )
    return srs


def _coalesce(lists: list) -> tuple:
    """The union of sparse lists (columns ascending, in their dtype) and the sum at each column,
    added list by list in the order given: the same lists in the same order give the same bits
    anywhere (each list is free of duplicates, so no two additions of one call meet even on a GPU).
    """
    union, place = torch.unique(torch.cat([indices for indices, _ in lists]), return_inverse=True)
    sums = torch.zeros(union.numel(), device=lists[0][1].device)
    start = 0
    for _, values in lists:
        sums.index_add_(0, place[start : start + values.numel()], values)
        start += values.numel()
    return union, sums


@register(
    "spardl",
    description="SparDL: Spar-Reduce-Scatter + Spar-All-Gather, global residual collection",
)
class SparDL(Synchronizer):
    """SparDL: Spar-Reduce-Scatter, optional Spar-All-Gather over ``teams``, global residuals.

    Options: ``teams`` (d, a divisor of P; 1 = no Spar-All-Gather), ``sag`` (``"bruck"``, B-SAG,
    for any d; ``"recursive"``, R-SAG, for d a power of two), ``srs`` (``"rounds"``: one message
    per round; ``"blocks"``: one per block, as released), ``dense_warmup`` (see :class:`Synchronizer`).
    """

    adds_residual = True  # step 1 adds the gradient, inside the cuts' selection passes where it can
    choices = {"sag": SAG_VARIANTS, "srs": tuple(SRS_EXECUTIONS)}

    @classmethod
    def check_options(cls, workers: int, **options) -> dict:
        """Check ``teams`` against P and ``sag``, and ``srs`` (see :meth:`Synchronizer.check_options`)."""
        options = super().check_options(workers, **options)
        if "srs" in options:
            check_srs(options["srs"])
        teams, sag = options.get("teams", 1), options.get("sag", "bruck")
        if "teams" in options or "sag" in options:
            options["teams"] = check_teams(teams, sag, workers)
        return options

    def __init__(
        self,
        comm,
        numel: int,
        density: float,
        teams: int = 1,
        sag: str = "bruck",
        srs: str = "rounds",
        dense_warmup: int = 0,
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup)
        self.teams = check_teams(teams, sag, self.size)
        self.sag = sag
        self.srs = check_srs(srs)
        self.team_size = self.size // teams
        self.team, self.position = divmod(self.rank, self.team_size)
        self.block_size = math.ceil(numel / self.team_size)
        self.block_budget = max(1, int(self.block_size * self.density))
        team_members = [self.team * self.team_size + i for i in range(self.team_size)]
        holders = [t * self.team_size + self.position for t in range(teams)]
        self.srs_steps = SRS_EXECUTIONS[srs](self.position, team_members)
        self.gather_steps = bruck_allgather_schedule(self.position, team_members)
        sag_schedule = bruck_allgather_schedule if sag == "bruck" else recursive_halving_schedule
        self.sag_steps = sag_schedule(self.team, holders) if teams > 1 else []
        self.height = HeightAdapter(self.block_budget, teams, self.block_size)
        # With one team the own cut's list is final: step 6 sets all its columns to 0 (step 3).
        self._own_list_final = teams == 1
        self.selector = Selector()
        self._work = torch.empty(0)
        self._nnz = 0

    @property
    def effective_density(self) -> float:
        """k_b entries kept in each of the m blocks: min(n, k_b * m) / n (a density below 1/B
        keeps one entry per block).
        """
        return min(self.numel, self.block_budget * self.team_size) / self.numel

    def _synchronize(self, grad, timer):
        budget = self.block_budget
        with timer("accumulate"):
            work = self._padded_work(self._residual)
        blocks = work.view(self.team_size, self.block_size)
        pending = set(range(self.team_size))  # blocks still without the gradient (step 1)
        # Receives reduce blocks in place, so a_o survives only where nothing was added: each
        # receive first saves, per block, the values it overwrites (O(k) per call).
        saves = [[] for _ in range(self.team_size)]
        sent = [None] * self.team_size  # per block, its cut's columns and k-th largest |x|

        def cut(first, count, keep):
            addend = self._first_touch(blocks, grad, pending, first, count, fuse=True)
            return self._cut(blocks, first, count, keep, sent, addend)

        def produce(step):
            with timer("select"):
                return pack(
                    [
                        piece
                        for first, count in _runs(step.send_items)
                        for piece in cut(first, count, budget)
                    ],
                    with_counts=False,
                )

        def consume(step, message):
            with timer("accumulate"):
                indices, values = unpack(message, 1, [budget * len(step.recv_items)])[0]
                for item, columns, summands in zip(
                    step.recv_items, indices.view(-1, budget).long(), values.view(-1, budget)
                ):
                    self._first_touch(blocks, grad, pending, item, 1, fuse=False)
                    saves[item].append((columns, blocks[item].index_select(0, columns)))
                    blocks[item].scatter_add_(0, columns, summands)  # columns are unique

        run_schedule(self.transport, self.srs_steps, produce, consume, work.device, timer)
        with timer("select"):
            own = cut(self.position, 1, budget if self.sag == "recursive" else self.height.value)[0]
        shares = []  # R-SAG: per step, the (columns, values) this holder keeps of what it dropped
        if self.teams > 1 and self.sag == "recursive":
            own, shares = self._recursive_sag(own, timer)
        elif self.teams > 1:
            own = self._bruck_sag(own, timer)
        with timer("accumulate"):
            result = self._new_result(work.device)
        nonzeros = {}  # per collected block, its list's non-zeros inside the vector (0-d tensors)

        def collect(held):  # step 6 for the lists held and not yet collected
            with timer("accumulate"):
                for block in [block for block in held if block not in nonzeros]:
                    columns, values = held[block]
                    nonzeros[block] = self._collect(
                        block, columns, values, blocks[block], saves[block], sent[block], result
                    )

        # The lists already held are collected while the next ones travel (blocks are disjoint,
        # so the order in which they arrive changes no bit of the result).
        collect(
            allgather_lists(
                self.transport,
                self.gather_steps,
                self.position,
                own,
                budget if self.teams == 1 else None,
                timer,
                meanwhile=collect,
            )
        )
        if shares:
            with timer("accumulate"):
                self._keep_shares(blocks[self.position], own[0].long(), shares)
        self._nnz = int(sum(nonzeros.values()))  # one device sync
        return result, work[: self.numel]

    def _collect(self, block: int, columns, values, row, saves: list, sent, result) -> torch.Tensor:
        """Write block ``block``'s gathered list (``columns`` ascending) / P into the zeroed
        ``result`` and leave its global residual in ``row`` (module docstring, step 6): at the
        listed columns 0 where this worker's cut sent the entry on (``sent``: the cut's columns,
        ascending, and its k-th largest ``|x|``) and the block's value when it was cut elsewhere;
        a_o at all other columns. Returns the list's non-zeros inside the vector (a 0-d tensor).

        One block at a time, so the second and later touches of its coordinates hit the cache.
        """
        columns = columns.long()  # once: the calls below would each convert int32 again
        start = block * self.block_size
        part = result[min(start, self.numel) : start + self.block_size]
        inside, kept = columns, values
        if part.numel() < self.block_size:  # the last block: its padding is a suffix of the list
            end = int(torch.searchsorted(columns, part.numel()))
            inside, kept = columns[:end], values[:end]
        put_(part, inside, kept / self.size)
        if block == self.position and self._own_list_final:  # all of it passed on
            self._restore(row, saves)
            put_(row, columns, 0.0)
            return torch.count_nonzero(kept)
        seen = row.index_select(0, columns)  # what the cut saw: nothing touched the block since
        passed_on = _passed_on(seen, columns, *sent)
        if saves:  # received into: a_o must come back, then what the cut dropped
            self._restore(row, saves)
            put_(row, columns, seen.masked_fill_(passed_on, 0.0))
        else:  # only cut: the row still holds a_o
            put_(row, columns[passed_on], 0.0)
        return torch.count_nonzero(kept)

    @staticmethod
    def _restore(row: torch.Tensor, saves: list) -> None:
        """Put back the values the receives into ``row`` overwrote, newest first, so that each
        coordinate ends at its a_o.
        """
        for touched, before in reversed(saves):
            put_(row, touched, before)

    def _padded_work(self, residual: torch.Tensor) -> torch.Tensor:
        """The zero-padded buffer of m*B entries whose first n hold ``residual``.

        The residual this class returns is a view of that buffer, so from the second call on
        it already lies there and nothing is copied.
        """
        padded = self._work
        if padded.numel() != self.team_size * self.block_size or padded.device != residual.device:
            padded = self._work = torch.zeros(
                self.team_size * self.block_size, device=residual.device
            )
        if residual.data_ptr() != padded.data_ptr():
            padded[: self.numel].copy_(residual)
        padded[self.numel :].zero_()
        return padded

    def _first_touch(
        self,
        blocks: torch.Tensor,
        grad: torch.Tensor,
        pending: set,
        first: int,
        count: int,
        fuse: bool,
    ):
        """Step 1 for the blocks ``first .. first+count-1`` about to be touched. If ``fuse`` and
        all of them are still ``pending``, return their part of the gradient for the cut's
        selection pass to add; otherwise add it into those pending now and return ``None``.
        """
        span = range(first, first + count)
        fused = fuse and pending.issuperset(span)
        for block in () if fused else pending.intersection(span):
            part = self._gradient_part(grad, block, 1)
            blocks[block][: part.numel()].add_(part)
        pending.difference_update(span)
        return self._gradient_part(grad, first, count) if fused else None

    def _gradient_part(self, grad: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """The entries of ``grad`` in blocks ``first .. first+count-1`` (none in the padding)."""
        return grad[min(self.numel, first * self.block_size) : (first + count) * self.block_size]

    def _cut(
        self, blocks: torch.Tensor, first: int, count: int, keep: int, sent: list, addend
    ) -> list:
        """Top-``keep`` of each of the blocks ``first .. first+count-1`` as one sparse list per
        block (int32 columns, values); the blocks stay as they are, and ``sent[block]`` gets the
        block's columns (int64, ascending) and its k-th largest ``|x|``. ``addend``: the gradient
        still to be added into these blocks, in the selection pass. The selector remembers the
        cut's thresholds under ``(first, count)``.
        """
        columns, values = self.selector.select(
            blocks[first : first + count], keep, addend, (first, count)
        )
        sent[first : first + count] = zip(columns, values.abs().amin(dim=1))
        return [
            (row_columns.to(torch.int32), row_values)
            for row_columns, row_values in zip(columns, values)
        ]

    def _bruck_sag(self, own: tuple, timer) -> tuple:
        """B-SAG: the union of the d teams' top-h lists of this position's block (summed in team
        order), cut to its top-k_b.
        """
        lists = allgather_lists(
            self.transport, self.sag_steps, self.team, own, self.height.value, timer
        )
        with timer("accumulate"):
            union, union_values = _coalesce([lists[team] for team in range(self.teams)])
        self.height.update(union.numel())
        if union.numel() > self.block_budget:
            with timer("select"):
                keep = self.selector.topk(union_values, self.block_budget)
                union, union_values = union[keep], union_values[keep]
        return union, union_values

    def _recursive_sag(self, own: tuple, timer) -> tuple:
        """R-SAG: the pairwise reduction of the d teams' top-k_b lists of this position's block
        (module docstring, step 4). Returns the final list (the same on all d holders) and, per
        step that cut, the dropped columns with this holder's share of their values.
        """
        budget = self.block_budget
        current, shares = own, []

        def produce(step):
            return pack([current], with_counts=False)

        def consume(step, message):
            nonlocal current
            theirs = unpack(message, 1, [budget])[0]
            mine_first = step.send_items[0] < step.recv_items[0]  # the lower group's list first
            with timer("accumulate"):
                union, values = _coalesce([current, theirs] if mine_first else [theirs, current])
            if union.numel() > budget:
                with timer("select"):
                    keep = self.selector.topk(values, budget)
                    dropped = torch.ones(union.numel(), dtype=torch.bool, device=values.device)
                    dropped[keep] = False
                    holders = len(step.send_items) + len(step.recv_items)  # a power of two: exact
                    shares.append((union[dropped].long(), values[dropped] / holders))
                    union, values = union[keep], values[keep]
            current = (union, values)

        run_schedule(self.transport, self.sag_steps, produce, consume, own[0].device, timer)
        return current, shares

    @staticmethod
    def _keep_shares(row: torch.Tensor, final: torch.Tensor, shares: list) -> None:
        """Add this holder's R-SAG shares into its residual ``row`` at the columns of the final
        list ``final`` (ascending); elsewhere the row holds its accumulated value, which already
        counts them. One step's columns are distinct; a column dropped in several steps (d >= 16)
        gets each share.
        """
        for columns, values in shares:
            inside = is_member(final, columns)
            row.index_add_(0, columns[inside], values[inside])

    def _count_nonzero(self, result):
        return self._nnz

    def _config(self) -> dict:
        return dict(super()._config(), teams=self.teams, sag=self.sag, srs=self.srs)

    def _extra_state(self) -> dict:
        return {"height": self.height.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        self.height.load_state_dict(state["height"])
