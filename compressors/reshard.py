"""Error-feedback state moved from P ranks to another number, with nothing owed lost.

A synchronizer returns the average out = (sum_r (g_r + e_r) - sum_r e'_r) / P, so what error
feedback still owes the model is the pending update U = sum_r e_r / P (and, with momentum
correction, V = sum_r u_r / P for the velocity). :func:`reshard` maps the P ranks' state dicts
to ``size`` ranks' so that sum_r' e''_r' / size = U exactly up to one float32 rounding per entry
(the sums are taken in float64): the new residual of entry i is size * U_i, held by the one new
rank that owns i (contiguous blocks of the vector), zero on every other rank. Each entry thus
stays in one rank's residual, as sparse as it was summed; only the sum was ever meaningful
(SparDL's global residual collection moves residual mass between ranks anyway).

What describes the old world is not mapped but re-derived by the synchronizer that loads the
state, at its next call: Ok-Topk's thresholds and region boundaries, SparDL's adaptive height h
and its ``teams="auto"`` choice (probed again), and the team count of a fixed ``teams`` (the new
run's own is used). The call count carries over (the largest of the ranks'), so dense and
density warm-ups go on where they were. Resharding to the same number of ranks returns the
states unchanged (copies), so a resume at the same P stays bit-identical.

    from compressors import reshard
    states = [torch.load(f"rank-{r}.pt", weights_only=True) for r in range(4)]
    mine = reshard(states, 3)[rank]         # for a synchronizer created alike on 3 ranks
    sync.load_state_dict(mine)

It takes the states of one synchronizer, of one :class:`~compressors.ddp.SparDLState` (the DDP
hook, per bucket layout), of the bucket pipeline the trainer saves, and of
:class:`~compressors.diloco.DiLoCo` (its round's start and outer momentum are the same on every
rank and carry over; its synchronizer's error feedback is resharded; a state taken within a
round makes the loading ranks start that round again, see ``DiLoCo.load_state_dict``), and of
one FSDP module's :class:`~compressors.fsdp.SparseReduceScatter`, whose residuals are in FSDP2's
reduce-scatter layout, which depends on P: each is taken back to the parameters, resharded, and
laid out for the new P (``compressors.fsdp_layout``). The sparse replica hook's (HSDP) are
refused: they are of a shard within a host.
"""

from __future__ import annotations

import copy

import torch

from .fsdp_layout import padded, padded_numel, unpadded
from .state import COMMON_KEYS, DTYPES

__all__ = ["reshard", "pending_update"]

#: Configuration entries that describe the old world's structure: dropped, the new run's rule.
_WORLD_CONFIG = ("teams", "sag", "layout")


def reshard(states, size: int) -> list:
    """Return ``size`` state dicts, one per new rank in rank order, for P ranks' ``states``.

    Args:
        states: the P ranks' ``state_dict()``s in rank order: of one synchronizer, of one
            ``SparDLState`` (``compressors.ddp``), a bucket pipeline's (``{"buckets": ...}``),
            a ``DiLoCo``'s (``compressors.diloco``) or one FSDP module's sparse reduce-scatter
            (``compressors.fsdp.SparseReduceScatter``).
        size: the new number of ranks, at least 1.

    Returns:
        A list of ``size`` state dicts, each loadable by ``load_state_dict`` on a synchronizer
        (or state) created the same way at world size ``size``. Pure: no communication.

    Raises:
        ValueError: an empty list, a bad ``size``, states of different synchronizers, or a
            kind of state it cannot map (the HSDP replica hook's, whose vector is a host's
            shard; an FSDP state without its recorded layout).
    """
    states = list(states)
    if not states:
        raise ValueError("reshard needs the states of at least one rank")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"reshard: size must be an integer >= 1, got {size!r}")
    if not all(isinstance(state, dict) for state in states):
        raise ValueError("reshard: every state must be a dict (a state_dict())")
    if len(states) == size:
        return copy.deepcopy(states)
    first = states[0]
    if "synchronizers" in first:
        return _reshard_fsdp(states, size)
    if "buckets" in first:
        return _reshard_buckets(states, size)
    if "diloco" in first:
        return _reshard_outer(states, size)
    return _reshard_synchronizer(states, size)


def pending_update(states, buffer: str = "residual") -> torch.Tensor:
    """Return sum_r ``buffer``_r / P over the ranks' synchronizer ``states``, in float64.

    The update error feedback still owes (``buffer="velocity"``: momentum correction's V); zeros
    where no rank holds the buffer.
    """
    held = [state[buffer].double().reshape(-1) for state in states if buffer in state]
    numel = states[0]["residual"].numel()
    total = torch.zeros(numel, dtype=torch.float64)
    for tensor in held:
        total += tensor
    return total / len(states)


def _reshard_synchronizer(states: list, size: int) -> list:
    """Reshard one synchronizer's states (see :func:`reshard`)."""
    first = states[0]
    if not isinstance(first.get("residual"), torch.Tensor):
        raise ValueError("reshard: not a synchronizer state (a dict with 'residual' and 'calls')")
    for rank, state in enumerate(states):
        same = (state.get("method"), state.get("numel")) == (first.get("method"), first["numel"])
        if not same or state["residual"].numel() != first["residual"].numel():
            raise ValueError(
                f"reshard: rank {rank}'s state is of another synchronizer "
                f"({state.get('method')!r} of {state.get('numel')}, rank 0's "
                f"{first.get('method')!r} of {first.get('numel')})"
            )
    numel = first["residual"].numel()
    dtype = DTYPES[first.get("dtype", "fp32")]
    owners = [(numel * rank // size, numel * (rank + 1) // size) for rank in range(size)]
    totals = {
        buffer: pending_update(states, buffer) * size
        for buffer in ("residual", "velocity")
        if any(buffer in state for state in states)
    }
    calls = max(int(state.get("calls", 0)) for state in states)
    config = dict(first.get("config", {}))
    resharded = []
    for rank, (start, end) in enumerate(owners):
        state = {key: value for key, value in first.items() if key in COMMON_KEYS}
        for buffer, total in totals.items():
            part = torch.zeros(numel, dtype=dtype if buffer == "residual" else torch.float32)
            part[start:end] = total[start:end].to(part.dtype)
            state[buffer] = part
        state["calls"] = calls
        state["config"] = _new_config(config, rank, size, len(states))
        resharded.append(state)
    return resharded


def _new_config(config: dict, rank: int, size: int, old_size: int) -> dict:
    """The recorded configuration of new rank ``rank`` of ``size`` (see :func:`reshard`)."""
    new = {key: value for key, value in config.items() if key not in _WORLD_CONFIG}
    if config.get("teams_requested") is not None:  # teams="auto": probed again
        new.update(teams=None, sag=None, layout=None)
    if "workers" in config:
        new["workers"] = size
    if "rank" in config:
        new["rank"] = rank
    new["resharded_from"] = old_size
    return new


def _reshard_buckets(states: list, size: int) -> list:
    """Reshard a DDP hook's or the bucket pipeline's states, bucket layout by bucket layout."""
    layouts = list(states[0]["buckets"])
    for rank, state in enumerate(states):
        if sorted(state.get("buckets", {})) != sorted(layouts):
            raise ValueError(
                f"reshard: rank {rank} holds other bucket layouts than rank 0 (every rank's "
                "buckets are the same in data parallelism: states of different runs?)"
            )
    new_buckets = [{} for _ in range(size)]
    for name in layouts:
        entry = states[0]["buckets"][name]
        mapped = _reshard_synchronizer([state["buckets"][name]["state"] for state in states], size)
        for rank, state in enumerate(mapped):
            new_buckets[rank][name] = {
                "numbers": list(entry["numbers"]),
                "sizes": list(entry["sizes"]),
                "state": state,
            }
    resharded = []
    for rank in range(size):
        state = dict(states[0], buckets=new_buckets[rank])
        if "rank" in state:
            state["rank"] = rank
        if "size" in state:
            state["size"] = size
        resharded.append(state)
    return resharded


def _reshard_fsdp(states: list, size: int) -> list:
    """Reshard the states of one FSDP module's sparse reduce-scatter (``compressors.fsdp``).

    Each parameter group's residual (and velocity) is FSDP2's reduce-scatter layout for the old
    number of ranks: it is taken back to the group's parameters, resharded as one
    synchronizer's (:func:`_reshard_synchronizer`) and laid out for ``size`` ranks
    (``compressors.fsdp_layout``), under the vector length of that layout.
    """
    first, old = states[0], len(states)
    if first.get("seam") != "reduce_scatter":
        raise ValueError(
            "reshard: a sparse replica hook's residuals (HSDP) are of a shard within a host, "
            "whose size changes with the ranks per host; they are resharded only to the same "
            "number of ranks"
        )
    numels = sorted(first["synchronizers"])
    for rank, state in enumerate(states):
        if sorted(state.get("synchronizers", {})) != numels:
            raise ValueError(
                f"reshard: rank {rank} holds other parameter groups than rank 0 (states of "
                "different FSDP modules or runs?)"
            )
    resharded = [dict(first, synchronizers={}, layouts={}) for _ in range(size)]
    for numel in numels:
        shapes = (first.get("layouts") or {}).get(numel)
        if shapes is None:
            raise ValueError(
                f"reshard: FSDP's layout of the parameter group of {numel} entries is not "
                "recorded (a state saved before 2026-12-07, or a group whose parameters are "
                "not those compressors.fsdp.attach found); resume on the same number of ranks"
            )
        entries = []
        for state in states:
            mine = dict(state["synchronizers"][numel])
            for buffer in ("residual", "velocity"):
                if isinstance(mine.get(buffer), torch.Tensor):
                    mine[buffer] = unpadded(mine[buffer].reshape(-1), shapes, old)
            mine["numel"] = mine["residual"].numel()
            entries.append(mine)
        target = padded_numel(shapes, size)
        for rank, mine in enumerate(_reshard_synchronizer(entries, size)):
            for buffer in ("residual", "velocity"):
                if buffer in mine:
                    mine[buffer] = padded(mine[buffer], shapes, size)
            mine["numel"] = target
            resharded[rank]["synchronizers"][target] = mine
            resharded[rank]["layouts"][target] = shapes
    return resharded


def _reshard_outer(states: list, size: int) -> list:
    """Reshard :class:`~compressors.diloco.DiLoCo` states.

    Rank 0's round start, outer momentum and counts go to every new rank (they are the same on
    every old one), the synchronizer's error feedback is resharded, and ``resharded_from`` is
    recorded.
    """
    inner = _reshard_synchronizer([state["synchronizer"] for state in states], size)
    return [dict(states[0], synchronizer=mine, resharded_from=len(states)) for mine in inner]
