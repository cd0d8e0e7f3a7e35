"""Per-rank checkpoints, written atomically every epoch; resume from the newest complete one.

Layout: ``DIR/epoch-0003/rank-0001.pt`` holds everything rank 1 needs to continue after epoch 3
(its own synchronizer residuals included). A file is written to ``*.tmp`` and renamed, so it is
either complete or absent; an epoch is complete when every rank's file exists. After saving
epoch e a rank deletes its file of epoch e-2: epoch e-1 is complete by then (every rank saved it
before joining epoch e's collectives), so one complete checkpoint always survives a crash.

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

import numpy as np
import torch

_EPOCH_DIR = re.compile(r"epoch-(\d+)$")
_KEPT_EPOCHS = 2
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_REASON = re.compile(r"WeightsUnpickler error:\s*(\S[^\n]*)")


class UnsafeCheckpoint(Exception):
    """A checkpoint file holds an object other than tensors and plain values: not loaded."""


class Checkpoints:
    """This rank's view of a checkpoint directory shared by (or mirrored on) all ranks."""

    def __init__(self, directory, comm):
        self.directory = Path(directory)
        self.comm = comm
        self.rank = comm.Get_rank()

    def path(self, epoch, rank=None):
        """The file of ``rank`` (default: this rank) for ``epoch``."""
        rank = self.rank if rank is None else rank
        return self.directory / f"epoch-{epoch:04d}" / f"rank-{rank:04d}.pt"

    def save(self, epoch, state):
        """Write ``state`` as this rank's checkpoint of ``epoch``, atomically; prune old ones."""
        target = self.path(epoch)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".tmp")
        torch.save(state, partial)
        os.replace(partial, target)
        if epoch > _KEPT_EPOCHS:
            self._remove(epoch - _KEPT_EPOCHS)

    def newest_complete(self):
        """The newest epoch every rank has a checkpoint of, or None (collective)."""
        common = None
        for epochs in self.comm.allgather(self._own_epochs()):
            common = set(epochs) if common is None else common & set(epochs)
        return max(common) if common else None

    def saved_epochs(self):
        """Every epoch of which any rank has a checkpoint, ascending (collective)."""
        return sorted(set().union(*self.comm.allgather(self._own_epochs())))

    def load(self, epoch):
        """This rank's checkpoint of ``epoch``, on the CPU; ``UnsafeCheckpoint`` if the file
        holds anything but tensors and plain values (nothing of it is constructed)."""
        path = self.path(epoch)
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

    def _own_epochs(self):
        if not self.directory.is_dir():
            return []
        epochs = []
        for entry in self.directory.iterdir():
            match = _EPOCH_DIR.match(entry.name)
            if match and self.path(int(match.group(1))).is_file():
                epochs.append(int(match.group(1)))
        return epochs

    def _remove(self, epoch):
        old = self.path(epoch)
        old.unlink(missing_ok=True)
        try:
            old.parent.rmdir()  # succeeds for the last rank to remove its file
        except OSError:
            pass


def mode_mismatch(state, key: str, value, mode: str, method: str) -> str | None:
    """Why a synchronizer ``state`` does not fit, or ``None``: the trainer's synchronizers (the
    overlapped buckets, DDP, FSDP) each save ``{key: value, "method": ...}``; ``mode`` names the
    run that saves no such ``key`` value, ``method`` this run's method."""
    if not isinstance(state, dict) or state.get(key) != value:
        return f"a synchronizer state of {mode}"
    if state.get("method") != method:
        return f"the method {state.get('method')!r} (here {method!r})"
    return None


def rng_state():
    """Every random generator the training touches: torch (CPU and CUDA), python, numpy; as
    tensors and plain values (NumPy's key array as an int64 tensor)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state):
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
