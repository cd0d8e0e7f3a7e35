"""Per-rank checkpoints, written atomically every epoch (and every ``--checkpoint-every``
iterations); resume from the newest complete one.

Layout: ``DIR/epoch-0003/rank-0001.pt`` holds everything rank 1 needs to continue after epoch 3
(its own synchronizer residuals included), ``DIR/epoch-0003-iter-000120/`` after 120 iterations
of epoch 4, and each such directory's ``WORLD`` the number of ranks that wrote it. A file is
written to ``*.tmp`` and renamed, so it is either complete or absent; a checkpoint is complete
when every rank's file exists. After saving, a rank deletes its files of all but its newest two
checkpoints: the older of the two is complete by then (every rank saved it before joining the
collectives that led to the newer), so one complete checkpoint always survives a crash.

A checkpoint holds only tensors and plain values (numbers, strings, lists, tuples, dicts), and is
read with ``torch.load(..., weights_only=True)``: a file that holds any other object (which
unpickling would construct, running whatever code it names) is refused, not loaded, so a
checkpoint directory others can write to cannot make the trainer run their code.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

_POSITION_DIR = re.compile(r"epoch-(\d+)(?:-iter-(\d+))?$")
_RANK_FILE = re.compile(r"rank-(\d+)\.pt$")
_KEPT = 2
_WORLD = "WORLD"  # the number of ranks that wrote a checkpoint, written by rank 0
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_REASON = re.compile(r"WeightsUnpickler error:\s*(\S[^\n]*)")


class UnsafeCheckpoint(Exception):
    """A checkpoint file holds an object other than tensors and plain values: not loaded."""


class Position(NamedTuple):
    """Where a checkpoint stands: ``epoch`` complete epochs, then ``iteration`` iterations of
    the next one (``--checkpoint-every``; 0 at an epoch's end). Ordered as training goes."""

    epoch: int
    iteration: int = 0

    @property
    def name(self) -> str:
        """Its directory's name: ``epoch-0003``, or ``epoch-0003-iter-000120`` within epoch 4."""
        within = f"-iter-{self.iteration:06d}" if self.iteration else ""
        return f"epoch-{self.epoch:04d}{within}"

    def __str__(self) -> str:
        if not self.iteration:
            return f"epoch {self.epoch}"
        return f"epoch {self.epoch} and {self.iteration} iterations of epoch {self.epoch + 1}"


def as_position(position) -> Position:
    """``position`` as a :class:`Position` (an int is an epoch's end)."""
    if isinstance(position, Position):
        return position
    if isinstance(position, int):
        return Position(position)
    return Position(*position)


class Checkpoints:
    """This rank's view of a checkpoint directory shared by (or mirrored on) all ranks.

    Rank 0 also writes the number of ranks into each checkpoint's ``WORLD`` file: a checkpoint
    of another number of ranks is complete when every one of its rank files is there (which a
    resume at another world size reads: the directory must then be shared).
    """

    def __init__(self, directory, comm):
        self.directory = Path(directory)
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def path(self, position, rank=None):
        """The file of ``rank`` (default: this rank) for ``position`` (or an epoch's end)."""
        rank = self.rank if rank is None else rank
        return self.directory / as_position(position).name / f"rank-{rank:04d}.pt"

    def save(self, position, state):
        """Write ``state`` as this rank's checkpoint at ``position``, atomically; prune old ones
        (this rank keeps its newest two: the one before the newest is complete by then, since
        every rank saved it before joining the collectives that led to the newest)."""
        target = self.path(position)
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            world = f"{self.size}\n"
            _write_atomically(target.parent / _WORLD, lambda path: path.write_text(world))
        _write_atomically(target, lambda path: torch.save(state, path))
        for old in sorted(self._own_positions())[:-_KEPT]:
            self._remove(old)

    def world(self, position):
        """The number of ranks that wrote the checkpoint at ``position``; None if not recorded
        (checkpoints written before it was)."""
        try:
            return int((self.directory / as_position(position).name / _WORLD).read_text())
        except (OSError, ValueError):
            return None

    def newest_complete(self):
        """The newest position with a complete checkpoint, or None (collective): one every rank
        of this run has its file of (of this world size, or of one not recorded), or one of
        another world size whose every rank file every rank of this run can see."""
        common = None
        for positions in self.comm.allgather(self._complete_here()):
            common = set(positions) if common is None else common & set(positions)
        return max(common) if common else None

    def saved_positions(self):
        """Every position of which any rank has a checkpoint file, ascending (collective)."""
        return sorted(set().union(*self.comm.allgather(self._positions_with_files())))

    def load(self, position, rank=None):
        """``rank``'s (default: this rank's) checkpoint at ``position``, on the CPU;
        ``UnsafeCheckpoint`` if the file holds anything but tensors and plain values (nothing
        of it is constructed)."""
        path = self.path(position, rank)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:  # torch's message: a page of advice, one name
            named = _GLOBAL.search(str(error))
            if named is None:  # a damaged file: torch's reason, without its advice to unpickle
                reason = _REASON.search(str(error))
                raise pickle.UnpicklingError(reason.group(1) if reason else str(error)) from None
            raise UnsafeCheckpoint(
                f"checkpoint {path} holds something other than tensors and plain values (it "
                f"names {named.group(1)}): refused, since loading it could run code; was it "
                "written by this trainer?"
            ) from None

    def _positions(self):
        if not self.directory.is_dir():
            return []
        positions = []
        for entry in self.directory.iterdir():
            match = _POSITION_DIR.match(entry.name)
            if match and entry.is_dir():
                positions.append(Position(int(match.group(1)), int(match.group(2) or 0)))
        return positions

    def _own_positions(self):
        return [position for position in self._positions() if self.path(position).is_file()]

    def _positions_with_files(self):
        return [
            position
            for position in self._positions()
            if any(_RANK_FILE.match(p.name) for p in (self.directory / position.name).iterdir())
        ]

    def _complete_here(self):
        complete = []
        for position in self._positions():
            world = self.world(position)
            if world in (None, self.size):
                if self.path(position).is_file():
                    complete.append(position)
            elif all(self.path(position, rank).is_file() for rank in range(world)):
                complete.append(position)
        return complete

    def _remove(self, position):
        old = self.path(position)
        old.unlink(missing_ok=True)
        if self.rank == 0:  # files of another world size that this run's ranks never remove
            world = self.world(position)
            for rank in range(self.size, world or 0):
                self.path(position, rank).unlink(missing_ok=True)
            (old.parent / _WORLD).unlink(missing_ok=True)
        try:
            old.parent.rmdir()  # succeeds for the last rank to remove its file
        except OSError:
            pass


def _write_atomically(target: Path, write) -> None:
    """``write(path)`` to a ``.tmp`` beside ``target``, then rename it over ``target``."""
    partial = target.with_name(target.name + ".tmp")
    write(partial)
    os.replace(partial, target)


def mode_mismatch(state, key: str, value, mode: str, method: str) -> str | None:
    """Why a synchronizer ``state`` does not fit, or ``None``: the trainer's synchronizers (the
    overlapped buckets, DDP, FSDP) each save ``{key: value, "method": ...}``; ``mode`` names the
    run that saves no such ``key`` value, ``method`` this run's method."""
    if not isinstance(state, dict) or state.get(key) != value:
        return f"a synchronizer state of {mode}"
    if state.get("method") != method:
        return f"the method {state.get('method')!r} (here {method!r})"
    return None


def numpy_state(state: tuple) -> dict:
    """A NumPy generator's ``get_state()`` as tensors and plain values (the key array as an
    int64 tensor), for a checkpoint that loads with ``weights_only=True``."""
    kind, keys, position, has_gauss, cached_gaussian = state
    return {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def numpy_state_tuple(saved: dict) -> tuple:
    """What :func:`numpy_state` returned, as ``set_state`` takes it."""
    keys = saved["keys"].numpy().astype(np.uint32)
    return (saved["kind"], keys, saved["position"], saved["has_gauss"], saved["cached_gaussian"])


def rng_state():
    """Every random generator the training touches: torch (CPU and CUDA), python, numpy; as
    tensors and plain values (NumPy's key array as an int64 tensor)."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": numpy_state(np.random.get_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state):
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(numpy_state_tuple(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
