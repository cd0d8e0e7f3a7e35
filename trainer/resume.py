"""Resuming a run: which checkpoint, whether it fits this run's flags and model, and its state
mapped to this run's number of ranks.

:func:`read_checkpoint` reads the newest complete checkpoint before anything heavy is built and
refuses one of another model, data set, method or density; one written by another number of
ranks is read whole (every rank's file) and its error-feedback state resharded
(``compressors.reshard``). :func:`resume` loads it into the built trainer once the checks that
need the model and the synchronizer pass.
"""

import random
import time

import numpy as np
import torch

import compressors
from trainer import powersgd_state
from trainer.checkpoint import UnsafeCheckpoint
from trainer.cli import note
from trainer.distributed import agree
from trainer.torch_ddp import METHODS as DDP_METHODS
from trainer.torch_ddp import is_ddp_method


def checkpoint_problem(checkpoints, args, size):
    """Why the checkpoints already in ``--checkpoint-dir`` forbid this run, or None
    (collective): a fresh run would mix with an earlier one, and a resume needs a complete one."""
    found = checkpoints.saved_positions()
    names = "epochs " + ", ".join(
        str(position.epoch) if not position.iteration else position.name for position in found
    )
    if found and not args.resume:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of an earlier run "
            f"({names}): pass --resume to continue it, or choose an empty directory"
        )
    if found and checkpoints.newest_complete() is None:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints ({names}), none of them "
            f"complete for this run's {size} worker(s) or for the run that wrote them: a "
            "rank's file is missing"
        )
    return None


def read_checkpoint(checkpoints, args, run_info, comm):
    """``(position, state)`` of the newest complete checkpoint for ``--resume``, or
    ``(None, None)`` without one (collective). Read before anything heavy is built, and refused
    (``UsageError``) if unreadable or saved by a run of another model, data set, compressor,
    density, or method option. A checkpoint of another number of ranks gives this rank the
    state of rank ``rank % P`` with the synchronizer's state resharded (:func:`reshard_state`)
    and no random generators (``rng`` None: :func:`resume` seeds them)."""
    position = checkpoints.newest_complete()
    if position is None:
        note(comm, f"no checkpoint in {args.checkpoint_dir}; starting from scratch")
        return None, None
    size, rank = comm.Get_size(), comm.Get_rank()
    world = checkpoints.world(position) or size
    ranks = [rank] if world == size else range(world)
    states, problem = _load(checkpoints, position, ranks)
    agree(comm, problem)
    state = states[rank % world if world != size else 0]
    saved = dict(state.get("run_info", {}), nworkers=state.get("nworkers"))
    keys = ["model", "dataset", "compressor", "density"] + [
        key for key in option_defaults(args.compressor) if key in saved
    ]  # older checkpoints: state_mismatch, later
    if world == size:
        keys.insert(2, "nworkers")
    differ = [
        f"{key} {saved.get(key)} (this run: {run_info.get(key)})"
        for key in keys
        if saved.get(key) != run_info.get(key)
    ]
    agree(comm, _misfit(position, args, differ))
    if world != size:
        try:
            synchronizer, problem = reshard_state([s["synchronizer"] for s in states], size), None
        except (ValueError, KeyError, TypeError) as error:
            synchronizer, problem = None, str(error)
        agree(comm, _misfit(position, args, [problem] if problem else []))
        state = dict(state, synchronizer=synchronizer[rank], rng=None)
    return position, state


def _load(checkpoints, position, ranks):
    """``(states, problem)``: the files of ``ranks`` at ``position``, or why one is unreadable."""
    states = []
    for rank in ranks:
        try:
            states.append(checkpoints.load(position, rank))
        except UnsafeCheckpoint as error:
            return None, str(error)
        except Exception as error:  # noqa: BLE001 - whatever makes the file unreadable: one clear message
            path = checkpoints.path(position, rank)
            detail = str(error).splitlines()[0] if str(error) else "no detail"
            return None, (
                f"checkpoint {path} is unreadable ({type(error).__name__}: {detail}); remove "
                f"{path.parent} to resume from the checkpoint before it"
            )
        if not isinstance(states[-1], dict):
            return None, f"checkpoint {checkpoints.path(position, rank)} is not a trainer state"
    return states, None


def reshard_state(states, size):
    """The trainer's synchronizer states of P ranks (``synchronizer`` of each checkpoint) for
    ``size`` ranks: the flat synchronizer's, the overlapped buckets' and FSDP's sparse
    reduce-scatters' error feedback by ``compressors.reshard`` (FSDP's per module, each in
    FSDP2's layout of its parameters), PowerSGD's by :func:`trainer.powersgd_state.reshard`;
    DDP's other native methods and dense FSDP hold none.

    Raises:
        ValueError: HSDP with a sparse method (its residuals are of a host's shard), or what
            ``compressors.reshard`` refuses.
    """
    first = states[0]
    if first.get("ddp") and "powersgd" in first:
        mapped = powersgd_state.reshard([state["powersgd"] for state in states], size)
        return [dict(first, powersgd=state) for state in mapped]
    if first.get("ddp") or (first.get("fsdp") and not first.get("comms")):
        return [dict(first) for _ in range(size)]
    if first.get("fsdp") == "hsdp":
        raise ValueError(
            f"--hsdp with {first.get('method')}: its residuals are of each host's shard and are "
            f"not resharded to another number of ranks; resume on {len(states)} ranks"
        )
    if first.get("fsdp"):
        comms = {
            name: compressors.reshard([state["comms"][name] for state in states], size)
            for name in first["comms"]
        }
        return [
            dict(first, comms={name: mapped[rank] for name, mapped in comms.items()})
            for rank in range(size)
        ]
    return compressors.reshard(states, size)


def resume(trainer, position, state, args, comm, log):
    """Load ``state``, :func:`read_checkpoint`'s checkpoint at ``position``, into ``trainer``
    (collective) once the checks that need the built model and synchronizer pass: the same
    number of parameters, and a synchronizer state that fits (``state_mismatch``)."""
    saved, numel = state.get("synchronizer", {}).get("numel"), trainer.synchronizer.numel
    overlapped = bool(state.get("synchronizer", {}).get("overlap"))
    counters = [
        f"{key} {state.get(key)!r} (a count: a whole number >= 0)"
        for key in ("epoch", "global_step", "epoch_samples")
        if key in state
        if isinstance(state.get(key), bool)
        or not isinstance(state.get(key), int)
        or state.get(key) < 0
    ]
    problem = (
        "; ".join(counters)
        if counters
        else f"parameters {saved} (this run: {numel})"
        if saved != numel
        else "a synchronizer state of an overlapped run (resume it without --no-overlap)"
        if overlapped and not trainer.synchronizer.overlaps_backward
        else trainer.synchronizer.state_mismatch(state.get("synchronizer"))
    )
    agree(comm, _misfit(position, args, [problem] if problem else []))
    if state.get("rng") is None:  # another world size: each rank draws anew
        seed = args.seed + 1_000_003 * comm.Get_rank() + int(state.get("global_step", 0))
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
    try:
        trainer.load_state_dict(state, position)
        problem = None
    except (KeyError, TypeError, ValueError, RuntimeError) as error:  # a forged or damaged file
        detail = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        problem = f"{type(error).__name__}: {detail[:300] or 'no detail'}"
    agree(comm, _misfit(position, args, [problem] if problem else []))
    world = state.get("nworkers") or comm.Get_size()
    try:  # how much work a failure cost at most: the checkpoint's age, to training again
        written = trainer.checkpoints.path(position, 0).stat().st_mtime
        age = f" (written {time.time() - written:.1f} s ago)"
    except (AttributeError, OSError):
        age = ""
    if world != comm.Get_size():
        log.note(
            f"resumed iteration {trainer.global_step} of a {world}-rank run on "
            f"{comm.Get_size()} ranks; residuals resharded{age}"
        )
    else:
        log.note(f"resumed from the checkpoint of {position}{age}")


def option_defaults(method):
    """The options of ``method`` (registered or DDP) with their defaults."""
    if is_ddp_method(method):
        return dict(DDP_METHODS[method])
    return compressors.option_defaults(method)


def _misfit(position, args, differ):
    """The message refusing the checkpoint at ``position`` for the reasons ``differ``, or None."""
    return (
        (
            f"checkpoint of {position} in {args.checkpoint_dir} does not fit this run: "
            f"{'; '.join(differ)}"
        )
        if differ
        else None
    )


__all__ = ["checkpoint_problem", "read_checkpoint", "reshard_state", "resume"]
