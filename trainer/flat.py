"""The trainer's blocking synchronization (``--no-overlap``, the authors'): one call per step.

Every synchronization the trainer runs speaks one protocol, which :class:`trainer.loop.Trainer`
relies on and nothing else:

- ``forward_model``: the module the training forward goes through (the model, or its DDP
  wrapper);
- ``overlaps_backward``: whether the gradients are averaged during backward (then an average is
  what ``--clip-grad-norm`` clips; else each worker clips its own before the call);
- ``finish(agree)``: after backward, leave the averaged gradient in every ``.grad``. ``agree`` is
  the loop's agreement on stopping (``agree(gradient=None, finite=True)``); ``finish`` calls it
  exactly once, before the call for a blocking synchronization (on the local gradient), after
  the last bucket for an overlapped one (with whether every average is finite);
- ``stats``: the step's ``bytes_sent``, ``seconds`` per phase, ``sync_seconds`` (the whole
  synchronization's time, 0 where it is all exposed) and ``compute_end`` (where backward's
  compute ended, when the synchronization knows better than the loop; else None);
- ``numel``, ``name``, ``density``;
- ``after_step()``: after the optimizer's step, what the synchronization does then, returning
  its seconds, which count as the step's (exposed) synchronization: local SGD's outer step
  (:class:`trainer.local.LocalSync`), nothing for the others;
- ``close()``: at the end of training, wait for what is still in flight (local SGD's overlapped
  outer synchronization; nothing for the others);
- ``evaluation()``: a context within which the model is the one to evaluate (local SGD's outer
  parameters, the same on every rank; the model itself for the others);
- ``state_dict()``, ``load_state_dict(state)`` and ``state_mismatch(state)``: the
  synchronization's own state (residuals);
- ``training_state(model, optimizer)`` and ``load_training_state(model, optimizer, model_state,
  optimizer_state)``: the model's and the optimizer's state as a checkpoint holds them (plain
  tensors, whole: :class:`WholeState`; FSDP gathers its shards).

:class:`FlatSync` wraps a ``compressors`` synchronizer; :class:`trainer.overlap.OverlappedSync`,
:class:`trainer.torch_ddp.DDPSync`, :class:`trainer.sharded.FSDPSync` and
:class:`trainer.local.LocalSync` are the others.
"""

from __future__ import annotations

import contextlib

import torch

from trainer.gradients import GradientBuffer


class StepDefaults:
    """The protocol's optional parts, as every synchronization but local SGD's has them."""

    def after_step(self) -> float:
        """Nothing after the optimizer's step (the protocol's ``after_step``): 0 seconds."""
        return 0.0

    def evaluation(self):
        """The model as it is is the one to evaluate (the protocol's ``evaluation``)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing is left in flight at the end of training (the protocol's ``close``)."""


class WholeState(StepDefaults):
    """Saving and restoring the model and the optimizer as their ``state_dict`` gives them:
    every synchronization whose ranks each hold the whole model (all but FSDP's)."""

    def training_state(self, model, optimizer) -> tuple:
        """Return ``(model state, optimizer state)`` for a checkpoint."""
        return model.state_dict(), optimizer.state_dict()

    def load_training_state(self, model, optimizer, model_state, optimizer_state) -> None:
        """Restore :meth:`training_state`'s states."""
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)


class FlatSync(WholeState):
    """Averages ``model``'s whole gradient with ``synchronizer`` in one blocking call.

    The gradients are copied into one flat buffer and the average written into one result
    buffer, both allocated once; the average is then copied back into the ``.grad`` fields.

    Args:
        synchronizer: a ``compressors`` synchronizer for the model's trainable entries.
        model: the module whose trainable parameters are synchronized.
        device: the rank's device.
    """

    overlaps_backward = False

    def __init__(self, synchronizer, model, device) -> None:
        self.synchronizer = synchronizer
        self.forward_model = model
        self.gradients = GradientBuffer(model.parameters(), device)
        self.averaged = torch.empty(self.gradients.numel, device=device)  # reused result
        self.name, self.numel = synchronizer.name, synchronizer.numel
        self.density = synchronizer.density

    @property
    def stats(self) -> dict:
        """The last call's stats (the synchronizer's), in the protocol's shape."""
        return {**self.synchronizer.stats, "sync_seconds": 0.0, "compute_end": None}

    def finish(self, agree) -> None:
        """Agree on the local gradient, then average it into every ``.grad``."""
        flat = self.gradients.gather()
        agree(gradient=flat)
        self.gradients.scatter(self.synchronizer.allreduce(flat, out=self.averaged))

    def state_dict(self) -> dict:
        """Return the synchronizer's state (its residuals)."""
        return self.synchronizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.synchronizer.load_state_dict(state)

    def state_mismatch(self, state) -> str | None:
        """Return why ``state`` cannot be loaded here, or ``None``."""
        return self.synchronizer.state_mismatch(state)
