"""Resuming a run: which checkpoint, and whether it fits this run's flags and model.

:func:`read_checkpoint` reads the newest complete checkpoint before anything heavy is built and
refuses one of another model, data set, worker count or method; :func:`resume` loads it into the
built trainer once the checks that need the model and the synchronizer pass.
"""

import compressors
from trainer.checkpoint import UnsafeCheckpoint
from trainer.cli import note
from trainer.distributed import agree
from trainer.torch_ddp import METHODS as DDP_METHODS
from trainer.torch_ddp import is_ddp_method


def checkpoint_problem(checkpoints, args, size):
    """Why the checkpoints already in ``--checkpoint-dir`` forbid this run, or None
    (collective): a fresh run would mix with an earlier one, and a resume needs one complete for
    ``size`` ranks."""
    found = checkpoints.saved_epochs()
    epochs = ", ".join(map(str, found))
    if found and not args.resume:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of an earlier run (epochs "
            f"{epochs}): pass --resume to continue it, or choose an empty directory"
        )
    if found and checkpoints.newest_complete() is None:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints (epochs {epochs}), none "
            f"of them complete for this run's {size} worker(s): written by another number of "
            "workers?"
        )
    return None


def read_checkpoint(checkpoints, args, run_info, comm):
    """``(epoch, state)`` of the newest complete checkpoint for ``--resume``, or ``(None, None)``
    without one (collective). Read before anything heavy is built, and refused (``UsageError``)
    if unreadable or saved by a run of another model, data set, worker count, compressor,
    density, or method option (each option of the method the checkpoint records: every one
    since they are all recorded, only teams, sag and srs before)."""
    epoch = checkpoints.newest_complete()
    if epoch is None:
        note(comm, f"no checkpoint in {args.checkpoint_dir}; starting from scratch")
        return None, None
    try:
        state, problem = checkpoints.load(epoch), None
    except UnsafeCheckpoint as error:
        state, problem = None, str(error)
    except Exception as error:  # noqa: BLE001 - whatever makes the file unreadable: one clear message
        state, problem = (
            None,
            (
                f"checkpoint {checkpoints.path(epoch)} is unreadable ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else 'no detail'}); remove "
                f"{checkpoints.path(epoch).parent} to resume from the epoch before it"
            ),
        )
    agree(comm, problem)
    saved = dict(state.get("run_info", {}), nworkers=state.get("nworkers"))
    keys = ["model", "dataset", "nworkers", "compressor", "density"] + [
        key for key in option_defaults(args.compressor) if key in saved
    ]  # older checkpoints: state_mismatch, later
    differ = [
        f"{key} {saved.get(key)} (this run: {run_info.get(key)})"
        for key in keys
        if saved.get(key) != run_info.get(key)
    ]
    agree(comm, _misfit(epoch, args, differ))
    return epoch, state


def resume(trainer, epoch, state, args, comm, log):
    """Load ``state``, :func:`read_checkpoint`'s checkpoint of ``epoch``, into ``trainer``
    (collective) once the checks that need the built model and synchronizer pass: the same
    number of parameters, and a synchronizer state that fits (``state_mismatch``)."""
    saved, numel = state.get("synchronizer", {}).get("numel"), trainer.synchronizer.numel
    overlapped = bool(state.get("synchronizer", {}).get("overlap"))
    problem = (
        f"parameters {saved} (this run: {numel})"
        if saved != numel
        else "a synchronizer state of an overlapped run (resume it without --no-overlap)"
        if overlapped and not trainer.synchronizer.overlaps_backward
        else trainer.synchronizer.state_mismatch(state.get("synchronizer"))
    )
    agree(comm, _misfit(epoch, args, [problem] if problem else []))
    trainer.load_state_dict(state)
    log.note(f"resumed from the checkpoint of epoch {epoch}")


def option_defaults(method):
    """The options of ``method`` (registered or DDP) with their defaults."""
    if is_ddp_method(method):
        return dict(DDP_METHODS[method])
    return compressors.option_defaults(method)


def _misfit(epoch, args, differ):
    """The message refusing the checkpoint of ``epoch`` for the reasons ``differ``, or None."""
    return (
        (
            f"checkpoint of epoch {epoch} in {args.checkpoint_dir} does not fit this run: "
            f"{'; '.join(differ)}"
        )
        if differ
        else None
    )
