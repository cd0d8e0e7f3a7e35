"""Synchronizing less often: local SGD and DiLoCo, with any synchronizer as the outer one.

DiLoCo (Douillard et al., arXiv 2311.08105): every worker takes ``local_steps`` H inner
optimizer steps on its own data from the round's start θ_0, and ends at its own θ_r. The
pseudo-gradient Δ_r = θ_0 - θ_r is then averaged once, by any registered method (``dense``, or a
sparse one at its density and wire, with its error feedback: the residual carries what a round
did not send into the next, as SparseLoCo does), and an outer step moves θ_0:

    m <- μ m + Δ;   θ_0 <- θ_0 - η_out (Δ + μ m)   (Nesterov, DiLoCo's default: η_out 0.7, μ 0.9)
                    θ_0 <- θ_0 - η_out m           (nesterov=False: heavy-ball momentum)

Every rank writes the new θ_0 into its parameters and starts the next round from it. Local SGD
is ``outer_lr=1, outer_momentum=0``; with H = 1 and an inner SGD without momentum that is
per-step data parallelism. The inner optimizer's state (momentum, Adam's moments) stays local,
as in DiLoCo; so do the buffers (batch-norm statistics).

    from compressors.diloco import DiLoCo
    outer = DiLoCo(model, method="spardl", density=0.01, local_steps=50, comm=MPI.COMM_WORLD)
    for batch in batches:
        loss(model, batch).backward()
        optimizer.step(); optimizer.zero_grad()
        outer.step()                      # every 50th call: one synchronization, one outer step

Like DDP, it starts every rank from rank 0's parameters (one exact all-reduce at construction).
``comm`` is an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from allreducers.transports import as_transport

from .registry import create

__all__ = ["DiLoCo", "outer_update", "check_outer", "FORMAT"]

#: The version of :meth:`DiLoCo.state_dict`'s format.
FORMAT = 1


def outer_update(delta, momentum, lr: float, mu: float, nesterov: bool, out=None) -> torch.Tensor:
    """Return the step to subtract from θ_0 for the averaged pseudo-gradient ``delta``.

    It is ``lr`` times Δ + μ m (Nesterov) or m, with ``momentum`` m updated in place first
    (``None`` when μ = 0: ``lr`` Δ). ``out``: where to write it (may be ``delta``; default new).
    """
    if momentum is not None:
        momentum.mul_(mu).add_(delta)
    if momentum is None:
        return torch.mul(delta, lr, out=out)
    if nesterov:
        return torch.add(delta, momentum, alpha=mu, out=out).mul_(lr)
    return torch.mul(momentum, lr, out=out)


class DiLoCo:
    """Local SGD and DiLoCo over a model's trainable parameters (see the module).

    Args:
        model: the module (or an iterable of parameters) that the inner optimizer steps.
        method: the outer synchronization, a registered method (``compressors.available()``).
        density: its density, in (0, 1] (a dense method ignores it).
        local_steps: H, inner steps per outer step, at least 1.
        outer_lr: η_out > 0 (DiLoCo's default 0.7).
        outer_momentum: μ in [0, 1) (DiLoCo's 0.9); 0 keeps no momentum buffer.
        nesterov: Nesterov momentum (DiLoCo's), else heavy-ball.
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        synchronizer: instead of ``method``, ``density`` and its options: a synchronizer
            already created (``compressors.create``) over ``comm`` for the parameters' numel.
        **method_options: the method's options (``wire="fp16"``, ``teams=2``, ...).

    Attributes:
        steps: inner steps so far; outer_steps: outer steps so far.
        synchronizer: the outer synchronizer (its ``stats`` are the last outer call's).
        seconds: the last :meth:`step`'s synchronization and outer update, 0 between them.

    Raises:
        ValueError: a bad ``local_steps``, ``outer_lr`` or ``outer_momentum``, no trainable
            parameter, or what ``compressors.create`` refuses.
    """

    def __init__(
        self,
        model,
        *,
        comm,
        method: str = "dense",
        density: float = 0.01,
        local_steps: int = 500,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        synchronizer=None,
        **method_options,
    ) -> None:
        check_outer(local_steps, outer_lr, outer_momentum)
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("DiLoCo: the model has no trainable parameter")
        self.local_steps, self.outer_lr = int(local_steps), float(outer_lr)
        self.outer_momentum, self.nesterov = float(outer_momentum), bool(nesterov)
        self.transport = as_transport(comm)
        numel = sum(p.numel() for p in self.params)
        if synchronizer is None:
            synchronizer = create(method, self.transport, numel, density, **method_options)
            synchronizer.count_nnz = False
        elif synchronizer.numel != numel:
            raise ValueError(
                f"DiLoCo: the synchronizer is for {synchronizer.numel} entries, the model's "
                f"trainable parameters hold {numel}"
            )
        self.synchronizer = synchronizer
        device = self.params[0].device
        self.start = self._flat()
        if self.transport.rank != 0:  # every rank starts from rank 0's parameters: x + 0 = x
            self.start.zero_()
        self.transport.allreduce_sum_(self.start)
        self._write(self.start)
        self.momentum = torch.zeros(numel, device=device) if self.outer_momentum else None
        self._delta = torch.empty(numel, device=device)
        self._average = torch.empty(numel, device=device)
        self.steps = self.outer_steps = 0
        self.seconds = 0.0

    def _flat(self, out=None) -> torch.Tensor:
        """The parameters as one float32 vector (into ``out``, else a new one)."""
        return torch.cat([p.detach().reshape(-1).float() for p in self.params], out=out)

    @torch.no_grad()
    def _write(self, flat: torch.Tensor) -> None:
        """Copy ``flat`` into the parameters."""
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    @contextlib.contextmanager
    def outer_parameters(self):
        """Within it, the parameters are the outer ones: θ_0 of the last outer step.

        They are the same on every rank: the model to evaluate. After it, each rank's own again.
        """
        if self.steps % self.local_steps == 0:  # at a round's start they are θ_0 already
            yield
            return
        local = self._flat()
        self._write(self.start)
        try:
            yield
        finally:
            self._write(local)

    @property
    def stats(self) -> dict:
        """The last outer synchronization's statistics (the synchronizer's)."""
        return self.synchronizer.stats

    @torch.no_grad()
    def step(self) -> bool:
        """Count one inner step; after every H-th, synchronize Δ and take the outer step.

        Collective on those steps. Returns whether it synchronized.
        """
        self.steps += 1
        self.seconds = 0.0
        if self.steps % self.local_steps:
            return False
        started = time.perf_counter()
        delta = torch.sub(self.start, self._flat(out=self._delta), out=self._delta)
        average = self.synchronizer.allreduce(delta, out=self._average)
        mu, nesterov = self.outer_momentum, self.nesterov
        self.start.sub_(outer_update(average, self.momentum, self.outer_lr, mu, nesterov, average))
        self._write(self.start)
        self.outer_steps += 1
        self.seconds = time.perf_counter() - started
        return True

    def state_dict(self) -> dict:
        """Return everything that carries across rounds, on the CPU.

        The round's start θ_0, the outer momentum, the counts and the synchronizer's state. With
        the inner optimizer's and the model's state (the caller's) a run continues
        bit-identically.
        """
        return {
            "diloco": FORMAT,
            "numel": self.start.numel(),
            "local_steps": self.local_steps,
            "outer": {
                "lr": self.outer_lr,
                "momentum": self.outer_momentum,
                "nesterov": self.nesterov,
            },
            "steps": self.steps,
            "outer_steps": self.outer_steps,
            "start": self.start.cpu().clone(),
            "momentum": None if self.momentum is None else self.momentum.cpu().clone(),
            "synchronizer": self.synchronizer.state_dict(),
        }

    def state_mismatch(self, state) -> str | None:
        """Why ``state`` (a :meth:`state_dict`) cannot be loaded here, or ``None``."""
        if not isinstance(state, dict) or state.get("diloco") != FORMAT:
            return (
                f"not a DiLoCo state of format {FORMAT} (a synchronizer's of per-step "
                "synchronization, without local steps?)"
            )
        if state.get("local_steps") != self.local_steps:
            return f"local_steps {state.get('local_steps')} (here {self.local_steps})"
        start = state.get("start")
        if not isinstance(start, torch.Tensor) or start.shape != self.start.shape:
            shape = tuple(getattr(start, "shape", ()))
            return f"its start holds {shape} entries (here {tuple(self.start.shape)})"
        if (state.get("momentum") is None) != (self.momentum is None):
            return "outer momentum differs (a buffer where here is none, or none where here is one)"
        return self.synchronizer.state_mismatch(state.get("synchronizer"))

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`.

        A state resharded from another number of ranks (``compressors.reshard``) taken in the
        middle of a round puts the parameters back to the round's start: the ranks' local
        progress of that round is dropped (it is the old ranks', and does not map), and the
        round starts again.

        Raises:
            ValueError: the state does not fit (:meth:`state_mismatch`).
        """
        problem = self.state_mismatch(state)
        if problem:
            raise ValueError(f"DiLoCo: the saved state does not fit: {problem}")
        self.start.copy_(state["start"])
        if self.momentum is not None:
            self.momentum.copy_(state["momentum"])
        self.synchronizer.load_state_dict(state["synchronizer"])
        self.steps, self.outer_steps = int(state["steps"]), int(state["outer_steps"])
        if state.get("resharded_from") and self.steps % self.local_steps:
            self.steps -= self.steps % self.local_steps
            self._write(self.start)


def check_outer(local_steps, outer_lr, outer_momentum) -> None:
    """Raise ``ValueError`` for H < 1, η_out <= 0 or μ outside [0, 1)."""
    if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
        raise ValueError(f"local_steps must be an integer >= 1, got {local_steps!r}")
    if not (outer_lr > 0 and math.isfinite(outer_lr)):
        raise ValueError(f"outer_lr must be a number > 0, got {outer_lr!r}")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_momentum must lie in [0, 1), got {outer_momentum!r}")
