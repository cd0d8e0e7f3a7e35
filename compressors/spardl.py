"""``spardl``: SparDL (Zhao et al., arXiv 2304.00737) with global residual collection.

The algorithm is explained once, in docs/DESIGN.md, section "SparDL", as steps 1-6; the code
names those steps by number. :class:`_Call` runs them, one method per step.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from allreducers import (
    MessageBuffers,
    allgather_rows,
    allgather_rows_in_order,
    bruck_allgather_schedule,
    check_choice,
    device_tensor,
    recursive_halving_schedule,
    run_schedule,
    srs_block_schedule,
    srs_schedule,
)

from .base import Synchronizer
from .registry import register
from .selection import Selector
from .sparse_ops import (
    as_numpy,
    first_of_runs,
    flat_nonzero,
    put_,
    search_sorted,
    top_of_union,
    union_of_rows,
)
from .teams import AUTO, Candidate, candidates, check_layout, probe, team_groups

__all__ = [
    "SAG_VARIANTS",
    "SRS_EXECUTIONS",
    "RESIDUAL_RULES",
    "HeightAdapter",
    "check_teams",
    "check_residuals",
    "check_srs",
    "SparDL",
]

SAG_VARIANTS = ("bruck", "recursive")
SRS_EXECUTIONS = {"rounds": srs_schedule, "blocks": srs_block_schedule}
RESIDUAL_RULES = ("global", "local")


class HeightAdapter:
    """B-SAG's adaptive selection size h (docs/DESIGN.md, SparDL, step 4: adaptive h).

    ``value`` is h, which :meth:`update` moves towards a union of ``block_budget`` entries
    without leaving [max(1, block_budget // teams), block_budget]. With one team, or when the
    budget covers the block, h is ``block_budget`` and never changes. A call hands its union's
    size over still on the device (:meth:`defer`); it is read when h is next asked for (the
    next call's step 3, or :meth:`state_dict`), where that call's work is long done.

    Args:
        block_budget: k_b, the entries each block keeps.
        teams: d, the number of teams.
        block_size: B, the entries of a block.
    """

    def __init__(self, block_budget: int, teams: int, block_size: int) -> None:
        self.block_budget = block_budget
        # At density 1 nothing may be dropped, so h stays k_b.
        self.fixed = teams == 1 or block_budget >= block_size
        self.floor = max(1, block_budget // teams)
        self._value = block_budget if self.fixed else self.floor
        self.step = max(1, (block_budget - self._value) // 100)
        self.direction = 0
        self.streak = 0
        self._pending = None  # a union size not read yet (a 0-d tensor)

    @property
    def value(self) -> int:
        """h, after the update of the last :meth:`defer` (which reads its size)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.update(int(pending))
        return self._value

    def defer(self, union_size: torch.Tensor) -> None:
        """:meth:`update` by the 0-d ``union_size``, when h is next asked for."""
        if not self.fixed:
            self._pending = union_size

    def update(self, union_size: int) -> None:
        """Adapt h after a Spar-All-Gather whose summed union had ``union_size`` entries."""
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
        self._value = min(self.block_budget, max(self.floor, self._value + wanted * self.step))

    def state_dict(self) -> dict:
        """Return the adapter's mutable state (plain ints)."""
        return {
            "value": self.value,  # first: it applies a deferred update
            "step": self.step,
            "direction": self.direction,
            "streak": self.streak,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._value, self.step = int(state["value"]), int(state["step"])
        self._pending = None
        self.direction, self.streak = int(state["direction"]), int(state["streak"])


def check_teams(teams, sag: str, workers: int) -> int:
    """Check SparDL's team count and Spar-All-Gather variant for a run on ``workers`` ranks.

    Args:
        teams: d; an integer that divides ``workers``, a power of two for R-SAG; or ``"auto"``
            (the choice is SparDL's, by a probe: docs/DESIGN.md, "Team layouts and teams=auto").
        sag: one of :data:`SAG_VARIANTS`.
        workers: P.

    Returns:
        ``teams`` as an int, or ``"auto"``.

    Raises:
        ValueError: ``teams`` or ``sag`` is invalid; the message names the valid values.
    """
    check_choice("sag", sag, SAG_VARIANTS, "not a Spar-All-Gather variant")
    if isinstance(teams, str) and teams == AUTO:
        return AUTO
    divisors = [d for d in range(1, workers + 1) if workers % d == 0]
    if isinstance(teams, bool) or not isinstance(teams, numbers.Integral) or teams not in divisors:
        raise ValueError(
            f"teams={teams!r} must divide the worker count {workers}; "
            f"valid: {', '.join(map(str, divisors))} or {AUTO!r}"
        )
    teams = int(teams)
    if sag == "recursive" and teams & (teams - 1):
        powers = [d for d in divisors if not d & (d - 1)]
        raise ValueError(
            f"sag='recursive' needs teams a power of two, got {teams}; use sag='bruck' "
            f"or teams in {', '.join(map(str, powers))}"
        )
    return teams


def check_residuals(residuals) -> str:
    """Return ``residuals`` if it names a residual rule (``"global"`` or ``"local"``).

    Raises:
        ValueError: it does not; the message names the valid ones.
    """
    return check_choice("residuals", residuals, RESIDUAL_RULES, "not a residual rule")


def check_srs(srs) -> str:
    """Check the name of a Spar-Reduce-Scatter execution.

    Returns:
        ``srs`` itself, a key of :data:`SRS_EXECUTIONS`.

    Raises:
        ValueError: ``srs`` names no execution; the message names the valid ones.
    """
    return check_choice("srs", srs, SRS_EXECUTIONS, "not a Spar-Reduce-Scatter execution")


@register(
    "spardl",
    description="SparDL: Spar-Reduce-Scatter + Spar-All-Gather, global residual collection",
)
class SparDL(Synchronizer):
    """SparDL: Spar-Reduce-Scatter, optional Spar-All-Gather over ``teams``, global residuals.

    Each call runs steps 1-6 of docs/DESIGN.md, section "SparDL". The gradient is padded to m
    blocks of B = ceil(n/m) entries (m = P / ``teams``), and each block keeps
    k_b = max(1, int(B * density)) entries.

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of each block kept, in (0, 1].
        teams: d, a divisor of P; 1 runs no Spar-All-Gather. Or ``"auto"``: at the first sparse
            call (or at :meth:`choose`) every rank times each configuration of d, ``sag`` and
            ``layout`` (``compressors.teams.candidates``) on throwaway synchronizers, a few
            calls of that gradient each, and all take the fastest; ``sag`` and ``layout`` given
            are then not used. The choice and the probe's times are in ``stats["auto"]`` and
            :attr:`auto`, the choice in the state (a resume keeps it, without a new probe).
        sag: the Spar-All-Gather variant: ``"bruck"`` (B-SAG, any d) or ``"recursive"``
            (R-SAG, d a power of two).
        srs: the Spar-Reduce-Scatter execution: ``"rounds"`` (one message per round) or
            ``"blocks"`` (one message per block, as the authors' released code runs it; the
            same bits).
        dense_warmup: calls that run a dense all-reduce first (see :class:`Synchronizer`).
        wire: see :class:`Synchronizer` (docs/DESIGN.md, section "The wire": what the
            residual keeps at a 16-bit wire).
        residuals: ``"global"``, SparDL's global residual collection (step 6: every discarded
            value stays in some worker's residual); or ``"local"``, the ablation the paper
            lacks: a worker keeps only what it discarded of its own accumulated values before
            sending, and what is discarded in later rounds is lost, as in methods without
            global residual collection. ``"local"`` does not conserve mass.
        layout: which ranks form a team (``compressors.teams``): ``"block"``, consecutive
            ranks (team t = ranks t*m .. t*m+m-1; with ranks placed host by host and m ranks
            per host, a host's ranks), or ``"strided"``, every d-th rank (team t = ranks r with
            r % d == t; with d ranks per host, the ranks of one local index across the hosts).
            The same with d = 1 or d = P.

    Attributes:
        auto: with ``teams="auto"``, once chosen: ``teams_requested``, the chosen ``teams``,
            ``sag`` and ``layout``, and the reason, ``probe`` (per candidate its options, ``ms``
            of its screening call and, for a finalist, ``final_ms``, the median of its final
            rounds; each call its slowest rank's; ``None``: not timed) and ``probe_seconds``
            (``compressors.teams.probe``); else ``None``.

    Raises:
        ValueError: an invalid option (see :func:`check_teams` and :func:`check_srs`).
    """

    adds_residual = True  # step 1 adds the gradient, inside the selection passes where it can
    # ``layout`` (compressors.teams.LAYOUTS) is checked in check_options: the trainer offers a
    # flag with its choices for each option here.
    choices = {"sag": SAG_VARIANTS, "srs": tuple(SRS_EXECUTIONS)}
    #: Words an option takes besides values of its default's type (``compressors.parse_option``).
    option_words = {"teams": (AUTO,)}

    @classmethod
    def check_options(cls, workers: int, **options) -> dict:
        """Check ``teams``, ``sag``, ``srs`` and ``layout`` for P = ``workers`` (the base class)."""
        options = super().check_options(workers, **options)
        if "srs" in options:
            check_srs(options["srs"])
        teams, sag = options.get("teams", 1), options.get("sag", "bruck")
        if "teams" in options or "sag" in options:
            options["teams"] = check_teams(teams, sag, workers)
        if "residuals" in options:
            check_residuals(options["residuals"])
        if "layout" in options:
            check_layout(options["layout"])
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
        wire: str = "fp32",
        residuals: str = "global",
        layout: str = "block",
    ) -> None:
        super().__init__(comm, numel, density, dense_warmup, wire)
        self.teams_requested = check_teams(teams, sag, self.size)
        self.residuals = check_residuals(residuals)
        self.conserves_mass = residuals == "global"
        self.srs = check_srs(srs)
        check_layout(layout)
        self._work = self._work_array = torch.empty(0)
        self._nnz = None
        self.auto = None
        self._pending = False
        if self.teams_requested != AUTO:
            self._configure(self.teams_requested, sag, layout)
        else:
            self._start_auto()

    def _configure(self, teams: int, sag: str, layout: str) -> None:
        """Set up the team structure of ``teams`` teams, variant ``sag``, ``layout``."""
        self.teams, self.sag, self.layout = teams, sag, layout
        self.team_size = self.size // teams
        self.team, self.position, team_members, holders = team_groups(
            self.rank, teams, self.size, layout
        )
        self.block_size = math.ceil(self.numel / self.team_size)
        self.block_budget = max(1, int(self.block_size * self.density))
        self.srs_steps = SRS_EXECUTIONS[self.srs](self.position, team_members)
        self.gather_steps = bruck_allgather_schedule(self.position, team_members)
        sag_schedule = bruck_allgather_schedule if sag == "bruck" else recursive_halving_schedule
        self.sag_steps = sag_schedule(self.team, holders) if teams > 1 else []
        self.height = HeightAdapter(self.block_budget, teams, self.block_size)
        # With one team the own block's list (step 3) is final: step 6 zeroes all its columns.
        self._own_list_final = teams == 1
        self.selector = Selector()
        # Row j of a call's tables is block (position + j) % m: every SRS and final-gather step
        # then touches one contiguous range of rows (docs/DESIGN.md, "The batched steps").
        self.row_blocks = [(self.position + row) % self.team_size for row in range(self.team_size)]
        # Per row, how many of its block's entries lie inside the vector (0: padding only).
        self.row_limits = [
            min(self.block_size, max(0, self.numel - block * self.block_size))
            for block in self.row_blocks
        ]
        self._tables = {}  # per device: what a call uses (tables)
        self.messages = MessageBuffers()  # this configuration's message sizes only

    def _start_auto(self) -> None:
        """Set up ``teams="auto"`` before its choice: one team for now, the probe pending.

        No probe is needed with a single candidate (as at P = 1): it is chosen at once.
        """
        options = candidates(self.size)
        self._configure(*options[0])
        self.auto, self._pending = None, len(options) > 1
        if not self._pending:
            self._chose(options[0], {"probe": [], "probe_seconds": 0.0})

    def _chose(self, chosen, record: dict) -> None:
        if self._pending or self.auto is None or (self.teams, self.sag, self.layout) != chosen:
            self._configure(*chosen)  # else kept as it is, its selector's thresholds included
        self.auto = {"teams_requested": AUTO, **chosen._asdict(), **record}
        self._pending = False

    def choose(self, grad: torch.Tensor) -> dict | None:
        """With ``teams="auto"``, choose the configuration now, by the probe on ``grad``.

        A collective (every rank calls it, each with its gradient). The first sparse call does
        it otherwise; once chosen (or with a fixed ``teams``) it does nothing. The residual and
        everything else this synchronizer keeps stay untouched: the calls that follow have the
        bits of a synchronizer created with the chosen options.

        Returns:
            :attr:`auto`.
        """
        if not self._pending:
            return self.auto
        self._check_gradient(grad)
        self.check_agreement()

        def build(candidate):
            sync = SparDL(
                self.transport,
                self.numel,
                self.density,
                srs=self.srs,
                wire=self.wire,
                residuals=self.residuals,
                **candidate.options(),
            )
            sync.count_nnz = False
            return sync

        self._chose(*probe(self.transport, build, grad.detach(), candidates(self.size)))
        return self.auto

    def allreduce(self, grad: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
        """See :meth:`Synchronizer.allreduce`.

        With ``teams="auto"`` the first sparse call chooses the configuration first
        (:meth:`choose`), outside the call's ``stats``.
        """
        if self._pending and self.calls >= self.dense_warmup:
            self.choose(grad)
        return super().allreduce(grad, out)

    @property
    def effective_density(self) -> float:
        """The fraction of the n entries one call keeps per worker: min(n, k_b * m) / n.

        A density below 1/B keeps one entry per block.
        """
        return min(self.numel, self.block_budget * self.team_size) / self.numel

    def reduce_scatter(self, grad: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
        """Return this rank's shard of the average: Spar-Reduce-Scatter (steps 1-2) alone.

        With one team the SRS blocks are the P shards, rank r ending with block r. The own block
        is returned dense, every entry that reached it (no step 3 cut), and its residual is
        emptied; every other block keeps what this rank's cut did not send, received partial
        sums included (each rank cuts each of them once), so mass is conserved:
        sum_w (grad_w + residual_w) = P * (the shards joined) + sum_w residual_w after the call.
        Steps 3-6 (Spar-All-Gather, the final gather) are not needed. With several teams,
        momentum correction, a density warm-up or during the dense warm-up it falls back to
        :meth:`allreduce` and the own shard (``Synchronizer.reduce_scatter``).
        """
        if (
            self.teams != 1
            or self.momentum
            or self.density_warmup
            or self.calls < self.dense_warmup
        ):
            return super().reduce_scatter(grad, out)
        self._shard_numel(out)
        self._check_gradient(grad)
        grad, start, timer = self._start_call(grad)
        call = _Call(self, grad, timer)
        shard = call.reduce_scatter()
        self._residual = call.work[: self.numel]
        with timer("accumulate"):
            shard.div_(self.size)
            if out is not None:
                shard = out.copy_(shard)
        self._nnz = None
        self._finish_call(timer, start, None)
        return shard

    def _synchronize(self, grad, timer):
        call = _Call(self, grad, timer)
        result = call.run()
        # After a Spar-All-Gather a list ends in repeats of its last column: counted once.
        self._nnz = (call.tables["final_values"], call.tables["final_columns"], self.teams > 1)
        return result, call.work[: self.numel]

    def padded_work(self, residual: torch.Tensor) -> torch.Tensor:
        """Return the zero-padded buffer of m*B entries whose first n hold ``residual``.

        The residual this class returns is a view of that buffer, so from the second call on
        it already lies there and nothing is copied.
        """
        padded = self._work
        if padded.numel() != self.team_size * self.block_size or padded.device != residual.device:
            padded = self._work = torch.zeros(
                self.team_size * self.block_size, device=residual.device
            )
        if not _shares(self._work_array, padded):
            # What a call's local work reads and writes (_Call): on the CPU its NumPy view.
            self._work_array = padded.numpy() if padded.device.type == "cpu" else padded
        if residual.data_ptr() != padded.data_ptr():
            padded[: self.numel].copy_(residual)
        if self.numel < padded.numel():
            self._work_array[self.numel :] = 0.0
        return padded

    def tables(self, device: torch.device) -> tuple:
        """Return what a call (``_Call``) uses on ``device``, made once per configuration.

        ``(tensors, arrays)``: two dicts of the same names, the tensors and what the call's
        local work reads and writes them as (on the CPU their NumPy views, else the tensors).
        The (m, k_b) tables it fills, and ``exponents``, each row's at a 16-bit wire (int32,
        (m,)); per row (see ``row_blocks``) ``bases``, the flat start of its block,
        ``offsets``, row * B (keys that keep the rows' columns in order), and ``limits``,
        ``row_limits`` (each int64 of shape (m, 1)); ``places``, 0 .. k_b-1.
        """
        tables = self._tables.get(device)
        if tables is None or not _shares(tables[1]["chosen"], tables[0]["chosen"]):
            shape, index = (self.team_size, self.block_budget), torch.int64
            rows = torch.arange(self.team_size, dtype=index)
            tensors = {
                "chosen": torch.empty(shape, dtype=index, device=device),
                "levels": torch.empty(shape[0], device=device),
                "sent": torch.empty(shape, device=device),
                "lost": torch.empty(shape, device=device),
                "exponents": torch.empty(shape[0], dtype=torch.int32, device=device),
                "final_columns": torch.empty(shape, dtype=index, device=device),
                "final_values": torch.empty(shape, device=device),
                "final_flat": torch.empty(shape, dtype=index, device=device),
                "new_values": torch.empty(shape, device=device),
                "bases": (torch.tensor(self.row_blocks) * self.block_size).to(device).view(-1, 1),
                "offsets": (rows * self.block_size).to(device).view(-1, 1),
                "limits": torch.tensor(self.row_limits, dtype=index).to(device).view(-1, 1),
                "places": torch.arange(shape[1], dtype=index).to(device).view(1, -1),
            }
            arrays = {name: as_numpy(tensor) for name, tensor in tensors.items()}
            tables = self._tables[device] = (tensors, arrays if device.type == "cpu" else tensors)
        return tables

    def _count_nonzero(self, result):
        """The final lists' non-zeros inside the vector, counted only if ``count_nnz``."""
        if not self.count_nnz or self._nnz is None:
            return None
        values, columns, repeats = self._nnz
        if repeats:
            values = values * first_of_runs(columns)
        return torch.count_nonzero(values)

    def _config(self) -> dict:
        config = dict(
            super()._config(),
            teams=self.teams,
            sag=self.sag,
            srs=self.srs,
            residuals=self.residuals,
            layout=self.layout,
        )
        if self.teams_requested == AUTO:
            config["teams_requested"] = AUTO
            if self._pending:  # nothing chosen yet
                config.update(teams=None, sag=None, layout=None)
        return config

    def _after_call(self) -> None:
        if self.auto is not None:
            self._stats["auto"] = self.auto

    def state_mismatch(self, state) -> str | None:
        """See :meth:`Synchronizer.state_mismatch`.

        With ``teams="auto"``, a state saved with ``teams="auto"`` fits whatever it chose
        (:meth:`load_state_dict` takes its choice), and one saved with a fixed team count does
        not.
        """
        config = state.get("config") if isinstance(state, dict) else None
        if self.teams_requested != AUTO or not isinstance(config, dict):
            return super().state_mismatch(state)
        if config.get("teams_requested") != AUTO:
            return (
                "the saved synchronizer state does not fit: teams "
                f"{config.get('teams')!r} (here {AUTO!r})"
            )
        if config.get("teams") is not None:
            try:
                check_teams(config["teams"], config.get("sag"), self.size)
                check_layout(config.get("layout", "block"))
            except ValueError as error:
                return f"the saved synchronizer state does not fit: {error}"
        chosen = ("teams", "sag", "layout")
        return super().state_mismatch(
            dict(state, config={k: v for k, v in config.items() if k not in chosen})
        )

    def load_state_dict(self, state: dict) -> None:
        """See :meth:`Synchronizer.load_state_dict`.

        With ``teams="auto"`` the configuration the state chose is taken (no probe), or none
        yet if it chose none.
        """
        problem = self.state_mismatch(state)
        if problem:
            raise ValueError(problem)
        config = state["config"]
        if self.teams_requested == AUTO and config.get("teams") is None:
            self._start_auto()
        elif self.teams_requested == AUTO:
            record = state.get("auto") or {"probe": None, "probe_seconds": None}
            record = {key: record.get(key) for key in ("probe", "probe_seconds")}
            chosen = (config["teams"], config["sag"], config.get("layout", "block"))
            self._chose(Candidate(*chosen), record)
        super().load_state_dict(state)

    def _extra_state(self) -> dict:
        extra = {"height": self.height.state_dict()}
        if self.auto is not None:
            extra["auto"] = self.auto
        return extra

    def _load_extra_state(self, state: dict) -> None:
        self.height.load_state_dict(state["height"])


class _Call:
    """One SparDL synchronization on this rank: its state, and its steps as methods.

    :meth:`run` performs steps 1-6 of docs/DESIGN.md, section "SparDL", in order. ``work`` is
    the padded buffer of a (step 1); when the call is done it holds the new residual. a_w below
    is this worker's own accumulated value (as in docs/DESIGN.md).

    The steps are batched (docs/DESIGN.md, "The batched steps"): per-block facts live in
    ``(m, k_b)`` tables whose row j is block ``row_blocks[j]``, and each step works on one
    contiguous range of rows with a fixed number of operations. The local work goes through
    *arrays*: ``dense`` (``work``), its m ``blocks``, the gradient and the tables are, on the
    CPU, NumPy views of the tensors (made once per configuration, the gradient's and the
    result's once per call), which dispatch no torch operation; elsewhere the tensors
    themselves. What travels (messages, Spar-All-Gather's lists) is a tensor everywhere.
    """

    def __init__(self, sync: SparDL, grad: torch.Tensor, timer) -> None:
        self.sync, self.timer = sync, timer
        with timer("accumulate"):
            self.work = sync.padded_work(sync.residual)
        m, device = sync.team_size, self.work.device
        self.cpu = device.type == "cpu"
        self.dense = sync._work_array
        self.blocks = self.dense.reshape(m, sync.block_size)
        self.grad_array = as_numpy(grad) if self.cpu else grad
        self.tables, arrays = sync.tables(device)  # the tensors (they travel), the arrays
        self.bases, self.offsets = arrays["bases"], arrays["offsets"]
        self.places, self.limits = arrays["places"], arrays["limits"]
        self.pending = set(range(m))  # blocks still without the gradient (step 1)
        # Receives reduce blocks in place, so a_w survives only where nothing was added: each
        # receive first saves the values it overwrites, (flat positions, values), O(k) a call.
        self.saves = []
        # Per row, its selection's columns (ascending; a shorter selection repeats its last
        # column), k-th largest |x|, the values as they travel and (at a 16-bit wire) what
        # quantization took off them: step 6 tells from these what the selection sent on.
        self.chosen, self.levels, self.sent = arrays["chosen"], arrays["levels"], arrays["sent"]
        # Lists travel quantized only where something travels; per row its exponent.
        self.coder = sync.codec if sync.codec.compact and sync.size > 1 else None
        self.lost = arrays["lost"] if self.coder is not None else None
        self.exponents = self.tables["exponents"]
        # Per row, the block's final list (steps 4-5), its flat positions in ``work`` and the
        # residual step 6 leaves there.
        self.final_columns, self.final_values = arrays["final_columns"], arrays["final_values"]
        self.final_flat, self.new_values = arrays["final_flat"], arrays["new_values"]
        self.collected = 0  # rows 0 .. collected-1 are collected (steps 5 and 6)
        self.result = self.result_array = None
        self.pair_list = None  # R-SAG: this holder's current list of the block (step 4)
        self.pair_holders = 1  # R-SAG: the holders of the same current list
        self.shares = []  # R-SAG: per pair step that dropped entries, this holder's shares

    def run(self) -> torch.Tensor:
        """Run steps 1-6 and return the result; ``work`` then holds the new residual."""
        sync, timer = self.sync, self.timer
        self.spar_reduce_scatter()
        own = self.select_own_block()  # step 3
        if sync.teams > 1:  # step 4
            own = self.tensors(own)
            own = self.recursive_sag(own) if sync.sag == "recursive" else self.bruck_sag(own)
        self.gather_and_collect(own)  # steps 5 and 6
        with timer("accumulate"):
            self.leave_residuals()
            if self.shares and sync.residuals == "global":
                row = self.work.view(sync.team_size, sync.block_size)[sync.position]
                _keep_shares(row, own[0].long(), self.shares)
        return self.result

    def array(self, tensor):
        """Return ``tensor`` as the local work reads it: its NumPy view on the CPU."""
        return as_numpy(tensor) if self.cpu else tensor

    def tensor(self, array) -> torch.Tensor:
        """Return a local ``array`` as a tensor (a view on the CPU), to travel."""
        return torch.from_numpy(array) if self.cpu else array

    def tensors(self, arrays: tuple) -> tuple:
        """Return local ``arrays`` as tensors (:meth:`tensor`)."""
        return tuple(self.tensor(array) for array in arrays)

    def reduce_scatter(self) -> torch.Tensor:
        """Steps 1-2 only (one team): return the own block's dense sum, ``work`` the residual."""
        sync, timer = self.sync, self.timer
        self.spar_reduce_scatter()
        with timer("accumulate"):
            self.first_touch(sync.position, 1, fuse=False)
            own = self.work.view(sync.team_size, sync.block_size)[sync.position]
            shard = own.clone()
            own.zero_()
            if sync.team_size > 1:  # rows 1 .. m-1: the blocks this rank cut and sent
                flat = (self.bases[1:] + self.chosen[1:]).reshape(-1)
                put_(self.dense, flat, 0.0 if self.lost is None else self.lost[1:].reshape(-1))
        return shard

    def spar_reduce_scatter(self) -> None:
        """Step 2 (step 1 happens at each block's first touch)."""
        sync = self.sync
        run_schedule(
            sync.transport,
            sync.srs_steps,
            self.send_blocks,
            self.receive_blocks,
            self.work.device,
            self.timer,
            meanwhile=self.touch_received,
            dtype=sync.codec.recv_dtype,
            recv_numel=self.rows_numel(),
            buffers=sync.messages,
        )

    def touch_received(self, step) -> None:
        """Step 1 for the blocks ``step`` receives, while their lists travel.

        The receive adds the lists after the gradient, as it would have; the addition only
        moves into the time the message takes to arrive.
        """
        with self.timer("accumulate"):
            for first, count in _runs(step.recv_items):
                self.first_touch(first, count, fuse=False)

    def rows_numel(self):
        """The length of a message of k_b-entry lists, per step: fixed at every wire."""
        sync = self.sync
        return lambda step: sync.codec.rows_size(
            len(step.recv_items), sync.block_budget, sync.block_size
        )

    def rows(self, items) -> slice:
        """Return the rows of the blocks ``items``, which are consecutive rows."""
        first = (items[0] - self.sync.position) % self.sync.team_size
        return slice(first, first + len(items))

    def first_touch(self, first: int, count: int, fuse: bool):
        """Step 1 for the blocks ``first .. first+count-1``, which are about to be touched.

        If ``fuse`` and all of them still lack the gradient, return their part of it for the
        selection pass to add; otherwise add it into those that lack it and return ``None``.
        """
        span = range(first, first + count)
        fused = fuse and self.pending.issuperset(span)
        if not fused:
            for start, length in _runs(sorted(self.pending.intersection(span))):
                part = self.gradient_part(start, length)
                target = self.blocks[start : start + length].reshape(-1)[: part.shape[0]]
                target += part  # in place, through the view
        self.pending.difference_update(span)
        return self.gradient_part(first, count) if fused else None

    def gradient_part(self, first: int, count: int):
        """Return the gradient's entries in blocks ``first .. first+count-1`` (not the padding)."""
        block_size = self.sync.block_size
        return self.grad_array[
            min(self.sync.numel, first * block_size) : (first + count) * block_size
        ]

    def select(self, items, keep: int) -> slice:
        """Select the top-``keep`` of each block of ``items`` (consecutive rows) into the tables.

        The blocks keep their values (nothing is zeroed): a sent block's dense copy holds what
        its selection dropped, which step 6 needs. The selector remembers the thresholds under
        ``(first, count)`` of each run of consecutive blocks. Returns the rows written.
        """
        rows = self.rows(items)
        row = rows.start
        for first, count in _runs(items):
            addend = self.first_touch(first, count, fuse=True)
            columns, values = self.sync.selector.select(
                self.blocks[first : first + count], keep, addend, (first, count)
            )
            part = slice(row, row + count)
            self.chosen[part, :keep] = columns
            magnitudes = abs(values)
            self.levels[part] = _row_extreme(magnitudes, smallest=True)
            sent = values
            if self.coder is not None:
                travels = self.tensor(values)
                largest = self.tensor(_row_extreme(magnitudes, smallest=False))
                exponents = self.coder.row_exponents(travels, largest)
                sent = self.array(self.coder.quantize_rows(travels, exponents))
                self.exponents[part] = exponents
                self.lost[part, :keep] = values - sent
            self.sent[part, :keep] = sent
            row += count
        if keep < self.sync.block_budget:  # a shorter list repeats its last entry
            for table in (self.chosen, self.sent, self.lost):
                if table is not None:
                    table[rows, keep:] = table[rows, keep - 1 : keep]
        return rows

    def send_blocks(self, step) -> torch.Tensor:
        """Step 2, sending: the top-k_b of each block ``step`` sends, packed without counts."""
        with self.timer("select"):
            rows = self.select(step.send_items, self.sync.block_budget)
            chosen, sent = self.tables["chosen"], self.tables["sent"]
            exponents = None if self.coder is None else self.exponents[rows]  # from select
            out = self.send_buffer(len(step.send_items))
            return self.sync.codec.encode_rows(
                chosen[rows], sent[rows], self.sync.block_size, exponents, out
            )

    def send_buffer(self, lists: int) -> torch.Tensor:
        """The synchronizer's buffer for a message of ``lists`` k_b-entry lists (reused)."""
        sync = self.sync
        size = sync.codec.rows_size(lists, sync.block_budget, sync.block_size)
        return sync.messages.get("send", size, sync.codec.recv_dtype, self.work.device)

    def receive_blocks(self, step, message: torch.Tensor) -> None:
        """Step 2, receiving: add the received lists into their blocks' dense copies.

        The blocks have the gradient already (:meth:`touch_received`, while the lists travelled).
        """
        items = step.recv_items
        columns, summands = self.sync.codec.decode_rows(
            message, len(items), self.sync.block_budget, self.sync.block_size
        )
        with self.timer("accumulate"):
            columns, summands = self.array(columns), self.array(summands)
            flat = (self.bases[self.rows(items)] + columns).reshape(-1)
            self.saves.append((flat, self.dense[flat]))
            _add_at(self.dense, flat, summands.reshape(-1))  # the positions are distinct

    def select_own_block(self) -> tuple:
        """Step 3: the own block's top-h list (h = k_b for one team and for R-SAG), as arrays."""
        sync = self.sync
        keep = sync.block_budget if sync.sag == "recursive" else sync.height.value
        with self.timer("select"):
            self.select((sync.position,), keep)
        return self.chosen[0, :keep], self.sent[0, :keep]

    def bruck_sag(self, own: tuple) -> tuple:
        """Step 4 with B-SAG: the d teams' lists of this block summed, then its top-k_b.

        Fixed shapes, no read of the union's size: the d lists of h entries travel as rows
        (``allgather_rows``), their union has a capacity of d h entries, and the final list k_b
        (a shorter one repeats its last entry, as in a short selection). The union's size goes
        to the adaptive h on the device (:meth:`HeightAdapter.defer`).
        """
        sync = self.sync
        # Row t: team t's list, the order of the sums. The lists are quantized already
        # (select): exact on the wire.
        columns, values = allgather_rows_in_order(
            sync.transport,
            sync.sag_steps,
            own,
            sync.block_size,
            self.timer,
            sync.wire,
            sync.messages,
        )
        with self.timer("accumulate"):
            union, sums, size = union_of_rows(columns, values)
        sync.height.defer(size)
        with self.timer("select"):
            place = self.top_of_union(sums, size)
            final = union[place], sums[place]
        return self.quantize_final(final, holders=1 if sync.team == 0 else 0)

    def quantize_final(self, final: tuple, holders: int) -> tuple:
        """Return the block's final list (step 4) as the final gather carries it.

        At a 16-bit wire every holder of the list quantizes it alike (by rows: no read);
        ``holders`` > 0 keeps 1/``holders`` of what quantization removed as this holder's share
        (0: none of it), once per column (not for the repeats of a short list's last entry).
        """
        if self.coder is None:
            return final
        columns, values = final
        with self.timer("select"):
            sent = self.coder.quantize_row(values)
            if holders:
                lost = torch.where(first_of_runs(columns), (values - sent) / holders, -0.0)
                self.shares.append((columns.long(), lost))
        return columns, sent

    def recursive_sag(self, own: tuple) -> tuple:
        """Step 4 with R-SAG: the pairwise reduction of the d teams' top-k_b lists of this block.

        Returns the final list, the same on all d holders; ``shares`` then holds, per pair step,
        this holder's share of the values of the columns it dropped (zero elsewhere). Fixed
        shapes: the lists travel as rows of k_b entries, their union has 2 k_b places.
        """
        sync = self.sync
        self.pair_list = own
        run_schedule(
            sync.transport,
            sync.sag_steps,
            self.send_pair_list,
            self.merge_pair_list,
            own[0].device,
            self.timer,
            dtype=sync.codec.recv_dtype,
            recv_numel=lambda step: sync.codec.rows_size(1, sync.block_budget, sync.block_size),
            buffers=sync.messages,
        )
        return self.quantize_final(self.pair_list, self.pair_holders)

    def send_pair_list(self, step) -> torch.Tensor:
        """Step 4 with R-SAG, sending: the current list, as one row.

        At a 16-bit wire a merged list is quantized first; each of its holders keeps its share
        of what that removed.
        """
        if self.pair_holders > 1:
            self.pair_list = self.quantize_final(self.pair_list, self.pair_holders)
        columns, values = self.pair_list
        return self.sync.codec.encode_rows(
            columns.view(1, -1), values.view(1, -1), self.sync.block_size, out=self.send_buffer(1)
        )

    def merge_pair_list(self, step, message: torch.Tensor) -> None:
        """Step 4 with R-SAG, receiving: sum the partner's list into the current one, keep k_b."""
        sync = self.sync
        budget = sync.block_budget
        theirs = sync.codec.decode_rows(message, 1, budget, sync.block_size)
        mine = tuple(part.view(1, -1) for part in self.pair_list)
        mine_first = step.send_items[0] < step.recv_items[0]  # the lower group's list first
        with self.timer("accumulate"):
            ordered = (mine, theirs) if mine_first else (theirs, mine)
            union, sums, size = union_of_rows(
                torch.cat([ordered[0][0].long(), ordered[1][0].long()]),
                torch.cat([ordered[0][1], ordered[1][1]]),
            )
        holders = len(step.send_items) + len(step.recv_items)  # a power of two: exact
        with self.timer("select"):
            place = self.top_of_union(sums, size)
            dropped = torch.arange(sums.numel(), device=sums.device) < size
            dropped[place] = False
            self.shares.append((union, torch.where(dropped, sums / holders, -0.0)))
        self.pair_list = (union[place], sums[place])
        self.pair_holders = holders

    def top_of_union(self, sums: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """Return the places of the top-k_b of a union's ``sums`` (``sparse_ops.top_of_union``)."""
        sync = self.sync
        places = self.tables["places"].view(-1)
        return top_of_union(sync.selector, sums, size, sync.block_budget, places)

    def gather_and_collect(self, own: tuple) -> None:
        """Steps 5 and 6: gather the team's block lists, collecting them in two batches.

        The zeroed result is made while the first step's message travels.

        Every final list has k_b entries (after a Spar-All-Gather a shorter one repeats its
        last entry): the Bruck steps move ranges of rows of the final tables. The rows held
        before the last step are collected while its message travels: at least half of them,
        in a fixed number of operations. Blocks are disjoint, so the order in which the lists
        arrive changes no bit.
        """
        sync = self.sync
        self.final_columns[0] = self.array(own[0])
        self.final_values[0] = self.array(own[1])
        allgather_rows(
            sync.transport,
            sync.gather_steps,
            (self.tables["final_columns"], self.tables["final_values"]),
            sync.block_size,
            self.timer,
            sync.wire,
            meanwhile=self.while_gathering,
            buffers=sync.messages,
        )
        self.make_result()  # (no gather step: one worker a team)
        self.collect(sync.team_size)

    def while_gathering(self, step, held: int) -> None:
        """While a gather step's message travels: the result, then (last step) the rows held."""
        self.make_result()
        if step is self.sync.gather_steps[-1]:
            self.collect(held)

    def make_result(self) -> None:
        """Make the zeroed result, once a call."""
        if self.result is None:
            with self.timer("accumulate"):
                self.result = self.sync._new_result(self.work.device)
                self.result_array = self.array(self.result)

    def collect(self, held: int) -> None:
        """Steps 5 and 6 for rows ``collected .. held-1``, whose final lists are here.

        Writes each list / P into the result and computes the residual step 6 leaves at its
        columns: 0 where this worker's selection sent the entry on (or what quantization took off
        it), and the block's value when it was selected elsewhere (:meth:`leave_residuals`
        writes it once every block is collected: the receives' saved values come back first).
        """
        sync, first = self.sync, self.collected
        if held <= first:
            return
        self.collected = held
        rows = slice(first, held)
        with self.timer("accumulate"):
            columns, values = self.final_columns[rows], self.final_values[rows]
            self.write_result(first, held, columns, values)
            flat = self.final_flat[rows]
            _add(self.bases[rows], columns, out=flat)
            if sync.residuals == "local":
                return
            # What the selection saw: nothing touched it since.
            seen = self.dense[flat]
            magnitude = abs(seen)
            level = self.levels[rows].reshape(-1, 1)
            passed_on = magnitude > level
            tied = magnitude == level
            # Row r's columns + r * B ascend across the rows: one search serves all of them.
            offsets = self.offsets[rows]
            chosen = (self.chosen[rows] + offsets).reshape(-1)
            query = (columns + offsets).reshape(-1)
            if self.cpu:
                # On the CPU, where a data-dependent size costs no wait, look up only the
                # entries at their row's level (usually a few), which can be either.
                at = flat_nonzero(tied.reshape(-1))
                query = query[at]
                place = search_sorted(chosen, query).clip(max=chosen.shape[0] - 1)
                passed_on.reshape(-1)[at] |= chosen[place] == query
                if self.lost is None:
                    self.new_values[rows] = _zero_where(passed_on, seen)
                    return
                # What quantization took off an entry sent on: quantized again with its row's
                # exponent, the entry comes out as it travelled (the same bits as ``lost``).
                # Only those (others as 0): they passed quantization's checks once already.
                sent_on = _zero_where(~passed_on, seen)
                sent = self.coder.quantize_rows(self.tensor(sent_on), self.exponents[rows])
                self.new_values[rows] = _where(passed_on, seen - sent.numpy(), seen)
                return
            place = search_sorted(chosen, query).clip(max=chosen.shape[0] - 1)
            member = (chosen[place] == query).reshape(columns.shape)
            passed_on |= tied & member
            # What stays of an entry sent on: nothing, or what quantization took off it.
            if self.lost is None:
                self.new_values[rows] = _zero_where(passed_on, seen)
            else:
                stays = self.lost[rows].reshape(-1)[place].reshape(columns.shape)
                self.new_values[rows] = _where(passed_on, stays, seen)

    def write_result(self, first: int, held: int, columns, values) -> None:
        """Write the final lists of rows ``first .. held-1`` / P into the result.

        Rows of padding only are left out; in a row that ends in padding, the padding columns
        (a suffix of the list) are redirected to the row's last entry inside the vector.
        """
        sync = self.sync
        limits = sync.row_limits[first:held]
        bases, bound = self.bases[first:held], self.limits[first:held]
        if min(limits) == 0:  # only when n < (m - 1) B
            inside = [row for row, limit in enumerate(limits) if limit]
            if self.cpu:
                inside = np.array(inside, dtype=np.int64)
            else:
                inside = device_tensor(inside, torch.int64, columns.device)
            columns, values, bases, bound = (t[inside] for t in (columns, values, bases, bound))
            limits = [limit for limit in limits if limit]
        if min(limits, default=sync.block_size) < sync.block_size:
            last = _count_below(columns, bound) - 1  # at least 0: see DESIGN.md
            place = _minimum(self.places, last)
            columns, values = _take_along(columns, place), _take_along(values, place)
        if columns.shape[0]:
            put_(self.result_array, (bases + columns).reshape(-1), (values / sync.size).reshape(-1))

    def leave_residuals(self) -> None:
        """Step 6: the residual in ``work`` once every row is collected.

        The receives' saved values come back newest first (a_w again); then the final columns
        get step 6's values (global residual collection), or (local residuals) the columns this
        worker's selections sent get 0 or what quantization took off them.
        """
        for flat, before in reversed(self.saves):
            put_(self.dense, flat, before)
        if self.sync.residuals == "global":
            put_(self.dense, self.final_flat.reshape(-1), self.new_values.reshape(-1))
            return
        flat = (self.bases + self.chosen).reshape(-1)
        put_(self.dense, flat, 0.0 if self.lost is None else self.lost.reshape(-1))


def _runs(items) -> list:
    """Return ``(first, count)`` of each stretch of consecutive numbers in ``items``.

    Cyclic block lists have at most two.
    """
    runs = []
    for item in items:
        if runs and runs[-1][0] + runs[-1][1] == item:
            runs[-1][1] += 1
        else:
            runs.append([item, 1])
    return [tuple(run) for run in runs]


# The local work's few operations whose spelling differs between NumPy arrays (the CPU) and
# tensors (elsewhere); the rest (slices, arithmetic, comparisons, indexing) read alike.


def _shares(array, tensor: torch.Tensor) -> bool:
    """Whether ``array`` is the local work's view of ``tensor``: its NumPy view, or itself.

    (A copy of the synchronizer would hold a NumPy array apart from its tensor.)
    """
    if isinstance(array, np.ndarray):
        return array.size == tensor.numel() and array.ctypes.data == tensor.data_ptr()
    return array is tensor


def _row_extreme(values, smallest: bool):
    """Return each row's smallest (or largest) value."""
    if isinstance(values, np.ndarray):
        return values.min(axis=1) if smallest else values.max(axis=1)
    return values.amin(dim=1) if smallest else values.amax(dim=1)


def _add(a, b, out) -> None:
    """Write ``a + b`` into ``out``."""
    if isinstance(out, np.ndarray):
        np.add(a, b, out=out)
    else:
        torch.add(a, b, out=out)


def _add_at(target, flat, values) -> None:
    """Add ``values`` into ``target`` at the distinct positions ``flat``."""
    if isinstance(target, np.ndarray):
        target[flat] += values
    else:
        target.scatter_add_(0, flat, values)


def _zero_where(mask, values):
    """Return ``values`` with (positive) zeros where ``mask`` is true; a tensor changes in place.

    Float32 arrays are masked by their bits (:func:`_where`).
    """
    if isinstance(values, np.ndarray):
        keep = mask.astype(np.int32)
        keep -= 1  # all ones where the value stays, 0 where it becomes +0
        return (values.view(np.int32) & keep).view(np.float32)
    return values.masked_fill_(mask, 0.0)


def _where(mask, chosen, other):
    """Return ``chosen`` where ``mask`` is true, ``other`` elsewhere.

    Float32 arrays are chosen between by their bits, the same bits as ``np.where``, which
    branches on each entry: on a mask with no pattern, as a collection's, it took 7 times as
    long (0.23 ms for 73,640 entries, on 2 EPYC cores).
    """
    if not isinstance(mask, np.ndarray):
        return torch.where(mask, chosen, other)
    take = mask.astype(np.int32)
    np.negative(take, out=take)  # all ones where ``chosen`` is taken
    other = other.view(np.int32)
    return (other ^ ((chosen.view(np.int32) ^ other) & take)).view(np.float32)


def _minimum(a, b):
    """Return the elementwise minimum of ``a`` and ``b`` (broadcast)."""
    return (np.minimum if isinstance(a, np.ndarray) else torch.minimum)(a, b)


def _count_below(columns, bound):
    """Return, per row of the ascending ``columns``, how many lie below the row's ``bound``.

    ``torch.searchsorted`` of the bound in each row (leftmost), shape (rows, 1).
    """
    if isinstance(columns, np.ndarray):
        return np.count_nonzero(columns < bound, axis=1, keepdims=True)
    return torch.searchsorted(columns, bound)


def _take_along(table, place):
    """Return ``table``'s entries at the columns ``place``, row by row."""
    if isinstance(table, np.ndarray):
        return np.take_along_axis(table, place, axis=1)
    return table.gather(1, place)


def _keep_shares(row: torch.Tensor, final: torch.Tensor, shares: list) -> None:
    """Add this holder's ``shares`` into its residual ``row`` at the ``final`` columns.

    Elsewhere the row holds a_w, which already counts them (docs/DESIGN.md, SparDL, step 6).
    One step's columns are distinct but for repeats of the last one, whose shares are zero; a
    column dropped in several R-SAG steps (d >= 16) gets each share. ``final`` ascends and may
    repeat its last column. Fixed shapes: entries outside it add -0.0, which changes no bit.
    """
    for columns, values in shares:
        place = search_sorted(final, columns).clamp_(max=final.numel() - 1)
        inside = final[place] == columns
        row.index_add_(0, columns, torch.where(inside, values, -0.0))
