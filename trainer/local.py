"""The trainer's local SGD and DiLoCo (``--local-steps H`` > 1): the synchronization of
:mod:`trainer.flat`'s protocol that averages nothing per step.

Each worker steps its own optimizer on its own gradient; every H-th step, after the optimizer's
step, :class:`compressors.diloco.DiLoCo` averages the pseudo-gradient with the run's method
(dense, or any registered method at its density and wire, with its error feedback) and takes
the outer step. The loop calls :meth:`LocalSync.after_step` there and counts its time as the
step's synchronization, all of it exposed: with ``--outer-overlap`` that is the wait for the
round before's average, the outer step and the start of this round's, while the averaging runs
on the communication thread during the next round's steps (and their time is compute).
"""

from __future__ import annotations

from compressors.stats import call_record
from trainer.flat import WholeState
from trainer.gradients import GradientBuffer


class LocalSync(WholeState):
    """Local steps with an outer synchronization every ``outer.local_steps`` steps.

    Args:
        outer: the :class:`~compressors.diloco.DiLoCo` over ``model``'s parameters.
        model: the module the training forward goes through.
        device: the rank's device.

    Attributes:
        stats: the protocol's; the outer call's (its bytes and phases) on a step that ran one,
            zeros on the others, and ``outer_steps`` so far on every step. With overlap, the
            call waited for on that step, and ``sync_seconds`` its time on the communication
            thread plus the exposed part.
    """

    overlaps_backward = False

    def __init__(self, outer, model, device) -> None:
        self.outer = outer
        self.forward_model = model
        self.gradients = GradientBuffer(model.parameters(), device)
        synchronizer = outer.synchronizer
        self.name, self.numel, self.density = (
            synchronizer.name,
            synchronizer.numel,
            synchronizer.density,
        )
        self.synchronized = False

    @property
    def stats(self) -> dict:
        """This step's statistics (see the class)."""
        # an inner step's: nothing sent (the one record, compressors.stats)
        taken = self.outer.stats if self.synchronized else call_record({}, None, {"total": 0.0})
        overlapped = self.synchronized and self.outer.overlap
        return {
            **taken,
            # overlapped: the whole synchronization, the call on the thread and the exposed part
            "sync_seconds": self.outer.thread_seconds + self.outer.seconds if overlapped else 0.0,
            "compute_end": None,
            "outer_steps": self.outer.outer_steps,
        }

    def finish(self, agree) -> None:
        """Agree on the local gradient, which stays each worker's own."""
        self.synchronized = False
        agree(gradient=self.gradients.gather())

    def after_step(self) -> float:
        """Count the optimizer's step; every H-th, the outer synchronization and step. Return
        its seconds (0 on the other steps)."""
        self.synchronized = self.outer.step()
        return self.outer.seconds

    def close(self) -> None:
        """At the end of training: wait for an outer synchronization still in flight."""
        self.outer.wait()

    def evaluation(self):
        """The outer parameters, the same on every rank, are the model to evaluate."""
        return self.outer.outer_parameters()

    def state_dict(self) -> dict:
        """The round's start, the outer momentum, the counts and the synchronizer's state."""
        return self.outer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (after the model's state: a state resharded within a
        round puts the parameters back to its start)."""
        self.outer.load_state_dict(state)

    def state_mismatch(self, state) -> str | None:
        """Why ``state`` cannot be loaded here, or ``None``."""
        return self.outer.state_mismatch(state)


__all__ = ["LocalSync"]
