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

``overlap=True`` overlaps each outer synchronization with the next round's inner steps, as
Streaming DiLoCo (arXiv 2501.18512) overlaps its fragments and the one-step-delayed variant of
Kale et al. (arXiv 2502.12996) does: at round t's end the ranks start averaging Δ_t on the
process's communication thread (``compressors.pipeline.comm_thread``) and take the outer step
of Δ_{t-1}, whose average arrived meanwhile, so round t + 1 starts at once from θ_0 updated by
the round before; each averaged Δ is applied one round late (the first round's end applies
nothing). The synchronization in flight uses ``comm`` while the caller computes: the caller
must not use the same communicator until :meth:`DiLoCo.wait` returns, or passes one of the
outer synchronization's own (``MPI.COMM_WORLD.Dup()`` with ``MPI_THREAD_MULTIPLE``; a
``torch.distributed`` group of its own), as the trainer does.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time

import torch

from allreducers.transports import as_transport

from .pipeline import post, side_stream
from .registry import create

__all__ = ["DiLoCo", "outer_update", "check_outer", "FORMAT"]

#: The version of :meth:`DiLoCo.state_dict`'s format (2: ``outer_overlap`` and ``pending`` added;
#: a state of format 1 loads as one without a pending average).
FORMAT = 2


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
        overlap: average each round's Δ on the communication thread during the next round,
            and apply it one round late (see the module).
        same_start: the caller guarantees that every rank already holds the same parameters
            (it broadcast them, as the trainer does); else (default) rank 0's are sent to every
            rank with one all-reduce of the parameters, collective, which costs what a dense
            all-reduce of them costs (minutes of a 10 Mbit/s link for 10M parameters).
        **method_options: the method's options (``wire="fp16"``, ``teams=2``, ...).

    Attributes:
        thread_seconds: with ``overlap``, the last synchronization waited for's seconds on the
            communication thread (0 without).
        steps: inner steps so far; outer_steps: outer steps taken so far (with ``overlap``,
            one fewer than the rounds ended: the last round's average is still in flight).
        synchronizer: the outer synchronizer (its ``stats`` are the last outer call's).
        seconds: the last :meth:`step`'s synchronization and outer update, 0 between them;
            with ``overlap``, the part the caller waited: the wait for the round before's
            average, the outer step and the start of this round's.

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
        overlap: bool = False,
        same_start: bool = False,
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
        self.overlap = bool(overlap)
        if self.overlap:
            self.transport.check_threads("DiLoCo's overlapped outer synchronization")
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
        if not same_start:
            if self.transport.rank != 0:  # every rank starts from rank 0's parameters: x + 0 = x
                self.start.zero_()
            self.transport.allreduce_sum_(self.start)
            self._write(self.start)
        self.momentum = torch.zeros(numel, device=device) if self.outer_momentum else None
        self._delta = torch.empty(numel, device=device)
        self._average = torch.empty(numel, device=device)
        self.steps = self.outer_steps = 0
        self.seconds = 0.0
        self._flight = None  # overlap: the synchronization in flight (_Flight)
        self._ready = False  # overlap: _average holds a round's averaged Δ, not applied yet
        self._done_stats = None  # overlap: the stats of the last synchronization waited for
        self.thread_seconds = 0.0

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
        """The last outer synchronization's statistics (the synchronizer's).

        With ``overlap``, those of the last one waited for (a copy taken then: the one in
        flight writes the synchronizer's meanwhile).
        """
        if self.overlap:
            return self._done_stats if self._done_stats is not None else self.synchronizer.stats
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
        if self.overlap:
            self._overlapped_round()
        else:
            delta = torch.sub(self.start, self._flat(out=self._delta), out=self._delta)
            self._outer_step(self.synchronizer.allreduce(delta, out=self._average))
        self._write(self.start)
        self.seconds = time.perf_counter() - started
        return True

    def _outer_step(self, average: torch.Tensor) -> None:
        """Move θ_0 by the outer step of the averaged Δ ``average`` (overwritten)."""
        mu, nesterov = self.outer_momentum, self.nesterov
        self.start.sub_(outer_update(average, self.momentum, self.outer_lr, mu, nesterov, average))
        self.outer_steps += 1

    def _overlapped_round(self) -> None:
        """End a round with ``overlap``: apply the round before's average, start this one's."""
        self.wait()  # Δ_{t-1} averaged into _average; _delta is free again
        torch.sub(self.start, self._flat(out=self._delta), out=self._delta)
        if self._ready:
            self._ready = False
            self._outer_step(self._average)
        self._flight = _Flight(self.transport, self.synchronizer, self._delta, self._average)

    def wait(self) -> None:
        """Wait for the synchronization in flight (``overlap``), if one is.

        Its average is kept, and applied at the next round's end. In short slices, so that
        Ctrl-C reaches the caller meanwhile.

        Raises:
            Exception: the error that ended that synchronization, re-raised.
        """
        flight, self._flight = self._flight, None
        if flight is not None:
            self.thread_seconds = flight.result()
            self._done_stats = dict(self.synchronizer.stats)
            self._ready = True

    def state_dict(self) -> dict:
        """Return everything that carries across rounds, on the CPU.

        The round's start θ_0, the outer momentum, the counts and the synchronizer's state, and
        with ``overlap`` the averaged Δ not applied yet (``pending``; a synchronization in
        flight is waited for first: a collective then). With the inner optimizer's and the
        model's state (the caller's) a run continues bit-identically.
        """
        self.wait()
        pending = self._average.cpu().clone() if self._ready else None
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
            "outer_overlap": self.overlap,
            "pending": pending,
            "synchronizer": self.synchronizer.state_dict(),
        }

    def state_mismatch(self, state) -> str | None:
        """Why ``state`` (a :meth:`state_dict`) cannot be loaded here, or ``None``."""
        if not isinstance(state, dict) or state.get("diloco") not in (1, FORMAT):
            return (
                f"not a DiLoCo state of format {FORMAT} (a synchronizer's of per-step "
                "synchronization, without local steps?)"
            )
        if bool(state.get("outer_overlap", False)) != self.overlap:
            return f"outer_overlap {bool(state.get('outer_overlap', False))} (here {self.overlap})"
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
        self.wait()  # a synchronization in flight writes the synchronizer's state
        self.start.copy_(state["start"])
        if self.momentum is not None:
            self.momentum.copy_(state["momentum"])
        self.synchronizer.load_state_dict(state["synchronizer"])
        self.steps, self.outer_steps = int(state["steps"]), int(state["outer_steps"])
        pending = state.get("pending")
        self._ready = pending is not None
        if self._ready:
            self._average.copy_(pending)
        if state.get("resharded_from") and self.steps % self.local_steps:
            self.steps -= self.steps % self.local_steps
            self._write(self.start)


class _Flight:
    """One outer synchronization run on the communication thread (``overlap``).

    ``synchronizer.allreduce(delta, out=average)`` as a job of ``transport``'s communication
    thread; on CUDA on the side stream, after what the caller's stream wrote into ``delta``.
    """

    def __init__(self, transport, synchronizer, delta, average) -> None:
        self._done, self._error, self._seconds = threading.Event(), None, 0.0
        stream = ready = None
        if delta.is_cuda:  # the side stream must see what the caller's stream wrote
            stream, ready = side_stream(transport, delta.device), torch.cuda.Event()
            ready.record(torch.cuda.current_stream(delta.device))
        self._stream = stream

        def job():
            started = time.perf_counter()
            try:
                if stream is None:
                    synchronizer.allreduce(delta, out=average)
                else:
                    with torch.cuda.stream(stream):
                        stream.wait_event(ready)
                        synchronizer.allreduce(delta, out=average)
                    stream.synchronize()
            except BaseException as error:  # handed to the caller's thread by result()
                self._error = error
            finally:
                self._seconds = time.perf_counter() - started
                self._done.set()

        post(transport, job)

    def result(self) -> float:
        """Wait for the job; re-raise its error; order the caller's stream after it.

        Returns the job's seconds on the communication thread.
        """
        while not self._done.wait(0.05):
            pass
        if self._error is not None:
            raise self._error
        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
        return self._seconds


def check_outer(local_steps, outer_lr, outer_momentum) -> None:
    """Raise ``ValueError`` for H < 1, η_out <= 0 or μ outside [0, 1)."""
    if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
        raise ValueError(f"local_steps must be an integer >= 1, got {local_steps!r}")
    if not (outer_lr > 0 and math.isfinite(outer_lr)):
        raise ValueError(f"outer_lr must be a number > 0, got {outer_lr!r}")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_momentum must lie in [0, 1), got {outer_momentum!r}")
