"""What every synchronizer shares: validation, residual memory, dense warm-up, stats, state.

A method subclasses :class:`Synchronizer` and implements ``_synchronize(accumulated)``, where
``accumulated`` is ``grad + residual`` (error feedback is written once, here). It returns the
averaged result and the new residual. Everything else (checking the gradient, timing, traffic,
``state_dict``) lives in this class, and so do the options every error-feedback method takes
(:data:`FEEDBACK_OPTIONS`): DGC's momentum correction and density warm-up.
"""

from __future__ import annotations

import abc
import numbers
import os
import time
import warnings

import torch

from allreducers import MessageBuffers, PhaseTimer, check_choice, check_wire, codec
from allreducers.transports import Transport, as_transport

from .agreement import check_agreement
from .sparse_ops import budget, count_nonzero, zero_
from .state import PARTS, FeedbackState
from .stats import call_record

__all__ = [
    "check_density",
    "check_int",
    "FEEDBACK_OPTIONS",
    "WARMUP_DENSITIES",
    "check_feedback",
    "warmup_density",
    "Synchronizer",
]


def check_density(density) -> float:
    """Return ``density`` as a float, or raise ``ValueError`` unless it is a number in (0, 1]."""
    try:
        if isinstance(density, (str, bytes, bool)):
            raise TypeError
        value = float(density)
    except (TypeError, ValueError):
        raise ValueError(f"density must be a number in (0, 1], got {density!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    return value


def check_int(name: str, value, minimum: int = 1) -> int:
    """Return ``value`` as an int; ``ValueError`` unless it is a whole number >= ``minimum``.

    Python's and NumPy's integers count; a bool does not. ``name`` names it in the message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


#: The options every error-feedback method takes besides its own, with their defaults
#: (``compressors.create`` applies them by :meth:`Synchronizer.set_feedback`).
FEEDBACK_OPTIONS = {"momentum": 0.0, "nesterov": False, "density_warmup": 0}

#: DGC's density warm-up (Lin et al., ICLR 2018): the densities of its four stages, each a
#: quarter of the warm-up, before the method's own (the larger of the two is used).
WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.00390625)


def check_feedback(momentum=0.0, nesterov=False, density_warmup=0) -> dict:
    """Return the feedback options checked and typed; ``ValueError`` naming a bad one."""
    try:
        if isinstance(momentum, (str, bytes, bool)):
            raise TypeError
        value = float(momentum)
    except (TypeError, ValueError):
        raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov must be true or false, got {nesterov!r}")
    if nesterov and value == 0.0:
        raise ValueError("nesterov=true needs momentum > 0")
    warmup = check_int("density_warmup", density_warmup, minimum=0)
    return {"momentum": value, "nesterov": nesterov, "density_warmup": warmup}


def warmup_density(call: int, warmup: int, density: float) -> float:
    """The density of sparse call ``call`` (0-based) under a density warm-up of ``warmup`` calls.

    Stage ``4 * call // warmup`` of :data:`WARMUP_DENSITIES` while ``call < warmup``, never below
    ``density``; ``density`` itself afterwards.
    """
    if call >= warmup:
        return density
    return max(density, WARMUP_DENSITIES[4 * call // warmup])


class Synchronizer(abc.ABC):
    """Averages one flat gradient over all ranks, keeping its own error-feedback residual.

    A method subclasses it and implements :meth:`_synchronize` (docs/ADDING_A_METHOD.md).

    Args:
        comm: an ``mpi4py`` communicator, a ``torch.distributed`` process group or a transport.
        numel: n, the length of the flat gradient.
        density: the fraction of the entries a call keeps, in (0, 1].
        dense_warmup: the first that many calls run a dense all-reduce instead (the authors'
            reproduction runs do this for 512 steps on VGG); the residual stays untouched
            meanwhile.
        wire: how values travel: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"``
            (:mod:`allreducers.wire`). At a 16-bit wire every sender keeps what quantization
            took off a value it sent in its residual.

    Error-feedback methods (``uses_residual``) also take :data:`FEEDBACK_OPTIONS` through
    ``compressors.create`` (:meth:`set_feedback`): ``momentum`` and ``nesterov`` (DGC's
    momentum correction) and ``density_warmup`` (DGC's exponential density schedule).

    Attributes:
        stats: the last call's ``bytes_sent``, ``messages``, ``rounds``, ``host_syncs`` (the
            transport's waits for a GPU; 0 on the CPU), ``nnz`` and ``seconds`` per phase
            (``select``, ``comm``, ``accumulate``, ``total``). On a GPU the call counts ``nnz``
            on the device and the count is read when ``stats`` is first read: no wait in the
            call.
            ``accumulate`` holds the additions (the residual, received sums, the result); a
            method with ``adds_residual`` counts the residual's addition under ``select``,
            since its selection pass does it.
        count_nnz: default True. Where a call's non-zeros are not known without a pass over
            the result (``dense``, ``topk``, ``gaussiank``, dense warm-up calls), count them for
            ``stats["nnz"]``; False leaves ``stats["nnz"]`` ``None`` there and the pass out of
            the call (the benchmark and the trainer do: the methods' released codes count
            nothing).
        calls: the calls so far, dense warm-up calls included.

    Raises:
        ValueError: an invalid ``numel``, ``density``, ``dense_warmup`` or ``wire``, or a
            ``numel`` above :attr:`max_numel`.
    """

    name = "base"
    uses_residual = True
    #: True where no value is lost: summed over the ranks, gradient + residual before a call
    #: equals P * result + residual after it (every value not in the result stays in some
    #: rank's residual). gTop-k is the exception: its tree reduction drops values.
    conserves_mass = True
    #: True where ``_synchronize`` adds the residual itself, fused with its first pass over the
    #: sum: it then receives the bare gradient (and still returns the new residual).
    adds_residual = False
    #: Calls after which :meth:`call_kind` repeats.
    kind_period = 1
    #: The longest gradient: sparse methods send indices as int32 (``None``: no limit).
    max_numel = 2**31 - 1
    #: The valid values of options that take one of a few names (``{"sag": ("bruck", ...)}``);
    #: command lines offer them as choices.
    choices: dict = {}

    @classmethod
    def check_options(cls, workers: int, **options) -> dict:
        """Check options for a run on ``workers`` ranks before any rank builds the method.

        Args:
            workers: the number of ranks P.
            **options: keyword options of the method (those of ``compressors.options``).

        Returns:
            The options converted to the types the method uses.

        Raises:
            ValueError: an option's value is invalid, with a message naming the valid ones.
        """
        for key, valid in cls.choices.items():
            if key in options:
                check_choice(key, options[key], valid)
        if "wire" in options:
            check_wire(options["wire"])
        feedback = {key: options[key] for key in FEEDBACK_OPTIONS if key in options}
        if feedback:
            if not cls.uses_residual:
                raise ValueError(
                    f"{', '.join(feedback)}: only error-feedback methods take "
                    f"{', '.join(FEEDBACK_OPTIONS)}"
                )
            checked = check_feedback(**feedback)
            options = dict(options, **{key: checked[key] for key in feedback})
        return options

    def __init__(
        self, comm, numel: int, density: float, dense_warmup: int = 0, wire: str = "fp32"
    ) -> None:
        numel = check_int("numel", numel)
        self.codec = codec(wire)
        self.wire = wire
        if self.max_numel is not None and numel > self.max_numel:
            raise ValueError(
                f"{self.name}: numel {numel} is above {self.max_numel}, the most its int32 "
                "indices address; split the gradient into several synchronizers"
            )
        self.transport: Transport = as_transport(comm)
        self.rank = self.transport.rank
        self.size = self.transport.size
        _warn_if_alone(self.size)
        self.numel = numel
        self.density = check_density(density)
        self.dense_warmup = check_int("dense_warmup", dense_warmup, minimum=0)
        self.calls = 0
        self.count_nnz = True
        #: Settings every rank must share (``compressors.create`` sets them), compared with the
        #: other ranks' in one small collective at the first call; ``None``: nothing to check.
        self.agreement = None
        self._residual = torch.zeros(numel)
        self._out = None
        #: Fixed-size message buffers kept across calls (``allreducers.MessageBuffers``).
        self.messages = MessageBuffers()
        self.momentum, self.nesterov, self.density_warmup = 0.0, False, 0
        self._velocity = None  # u of momentum correction
        self._scratch = None  # v before the call (to mask u by); Nesterov's direction, the mask
        self._rebuild = None  # builds the synchronizer of a density warm-up stage
        self._stage = None  # (density, synchronizer) of the current warm-up stage
        self.stats: dict = call_record({}, 0, {"total": 0.0})

    @property
    def stats(self) -> dict:
        """The last call's statistics (see the class); a count on the device is read here."""
        nnz = self._stats.get("nnz")
        if isinstance(nnz, torch.Tensor):
            self._stats["nnz"] = int(nnz)
        return self._stats

    @stats.setter
    def stats(self, stats: dict) -> None:
        self._stats = stats

    @property
    def residual(self) -> torch.Tensor:
        """This rank's error-feedback residual after the last call (zeros if unused)."""
        return self._residual

    @property
    def velocity(self) -> torch.Tensor | None:
        """Momentum correction's velocity u (``None`` without ``momentum``)."""
        return self._velocity

    def set_feedback(self, momentum=0.0, nesterov=False, density_warmup=0, rebuild=None) -> None:
        """Turn on DGC's momentum correction and density warm-up (``compressors.create`` does).

        Momentum correction (``momentum`` m > 0) moves SGD's momentum into the synchronizer, per
        entry and before the sparsification: each call updates the velocity u <- m u + g (with
        ``nesterov``, u <- m (u + g), and the call synchronizes u + g), the residual accumulates
        v <- v + u, the method selects from v, and u is zeroed wherever this rank's entry of v
        left its residual (momentum-factor masking: its residual entry is zero after the call,
        or at a 16-bit wire at most its value's rounding error). The optimizer then runs
        without momentum. Mass is conserved in v exactly as the method conserves it in
        gradient + residual; u is not mass. Dense warm-up calls average u densely (momentum SGD).

        Density warm-up (``density_warmup`` N > 0): the first N sparse calls run at the
        densities of :func:`warmup_density` (25%, 6.25%, 1.56%, 0.39%, each for N/4 calls,
        never below the method's density) by a synchronizer of that density built by
        ``rebuild(density)``, which this one lends its residual for the call.

        Raises:
            ValueError: an invalid value, or a method without error feedback.
        """
        feedback = check_feedback(momentum, nesterov, density_warmup)
        if not self.uses_residual and (feedback["momentum"] or feedback["density_warmup"]):
            raise ValueError(
                f"{self.name} keeps no residual: momentum and density_warmup need error feedback"
            )
        if feedback["density_warmup"] and rebuild is None:
            raise ValueError("density_warmup needs rebuild, to build the stages' synchronizers")
        self.momentum, self.nesterov = feedback["momentum"], feedback["nesterov"]
        self.density_warmup, self._rebuild = feedback["density_warmup"], rebuild
        self._velocity = torch.zeros(self.numel) if self.momentum else None

    @property
    def effective_density(self) -> float:
        """The fraction of the n entries one call keeps per worker, its budget in whole entries.

        Here k / n for k = max(1, int(n * density)), so a density below 1/n keeps one entry
        (more than asked).
        """
        return budget(self.numel, self.density) / self.numel

    def allreduce(self, grad: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
        """Return the average of ``grad`` over all ranks as synchronized by this method.

        A collective: every rank calls it. The result has the same bits on every rank; ``grad``
        is not modified.

        Args:
            grad: this rank's gradient, a 1-D float32 tensor of length ``numel``.
            out: an optional float32 tensor like ``grad`` that receives the result and is
                returned; reusing one across calls saves a large allocation per call (as
                training does). Otherwise the result is a new tensor on ``grad``'s device.

        Raises:
            ValueError: ``grad`` or ``out`` is not such a tensor, ``out`` is on another device
                or shares memory with the residual, or (methods that select) gradient plus
                residual holds NaN or inf.
        """
        self._check_gradient(grad)
        if out is not None:
            self._check_gradient(out, "out")
            if out.device != grad.device:
                raise ValueError(
                    f"{self.name}: out is on {out.device}, the gradient on {grad.device}"
                )
            if out.untyped_storage().data_ptr() == self._residual.untyped_storage().data_ptr():
                raise ValueError(
                    f"{self.name}: out shares memory with the residual, which the "
                    "call updates: pass a buffer of its own"
                )
        self._out = out
        grad, start, timer = self._start_call(grad)
        if self.momentum:
            with timer("accumulate"):
                grad = self._momentum_step(grad)
        if self.calls < self.dense_warmup:
            result = self._dense_average(grad, timer)
            nnz = Synchronizer._count_nonzero(self, result)
        else:
            if self.momentum:  # v = residual + u, to find the entries whose v left
                with timer("accumulate"):
                    before = torch.add(self._residual, grad, out=self._scratch[0])
            sync = self._warmup_stage(grad.device)
            if sync is self:
                result = self._sparse_call(grad, timer)
            else:  # a density warm-up stage, lent this synchronizer's residual for the call
                sync.load_feedback(self.feedback_state(), parts=("residual",))
                sync._out, sync.count_nnz = self._out, self.count_nnz
                result = sync._sparse_call(grad, timer)
                self.load_feedback(sync.feedback_state(), parts=("residual",))
                sync._out = None
            nnz = sync._count_nonzero(result)
            if self.momentum:
                with timer("accumulate"):
                    if _shares_memory(result, self._velocity, self._scratch):  # masking writes
                        result = result.clone()
                    self._mask_velocity(before)
        if out is not None and result is not out:
            result = out.copy_(result)
        self._out = None
        self._finish_call(timer, start, nnz)
        return result

    def _start_call(self, grad: torch.Tensor) -> tuple:
        """Begin a call on a checked ``grad``; return ``(grad detached, start time, timer)``.

        The ranks' agreement (at the first call), the residual moved to ``grad``'s device, the
        traffic counters reset.
        """
        self.check_agreement()
        grad = grad.detach()  # a tensor that requires grad is read as data: no graph, no history
        if self._residual.device != grad.device:
            self.to(grad.device)
        self.reset_traffic()
        return grad, time.perf_counter(), PhaseTimer(select=0.0, comm=0.0, accumulate=0.0)

    def _finish_call(self, timer: PhaseTimer, start: float, nnz) -> None:
        """Count the call and set :attr:`stats` from the transport's traffic and ``timer``."""
        self.calls += 1
        timer["total"] = time.perf_counter() - start
        self.stats = call_record(self.traffic_counts(), nnz, dict(timer))
        self._after_call()

    def reset_traffic(self) -> None:
        """Zero the traffic counted on this synchronizer's transport (a call does it first)."""
        self.transport.traffic.reset()

    def traffic_counts(self) -> dict:
        """Return the traffic since the last reset (``bytes_sent`` ... ``host_syncs``)."""
        traffic = self.transport.traffic
        return {
            "bytes_sent": traffic.bytes_sent,
            "messages": traffic.messages,
            "rounds": traffic.rounds,
            "host_syncs": traffic.host_syncs,
        }

    def allreduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks in place by the library all-reduce; return it.

        A collective on this synchronizer's transport, counted in its traffic.
        """
        return self.transport.allreduce_sum_(tensor)

    def reduce_scatter(self, grad: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
        """Return this rank's shard of the average of ``grad`` over all ranks (a collective).

        The vector is P equal shards, rank r's shard entries r*n/P .. (r+1)*n/P - 1 (FSDP's
        layout: ``compressors.fsdp``). Here: :meth:`allreduce`, then the own shard; SparDL
        overrides it with its Spar-Reduce-Scatter alone. ``out``: a float32 tensor of n/P
        entries that receives the shard.

        Raises:
            ValueError: n is not a multiple of P, ``out`` has another shape, or as
                :meth:`allreduce`.
        """
        shard = self._shard_numel(out)
        average = self.allreduce(grad)
        own = average[self.rank * shard : (self.rank + 1) * shard]
        return own.clone() if out is None else out.copy_(own)

    def _shard_numel(self, out) -> int:
        """Return n / P, checking that it is whole and that ``out`` (if given) has that shape."""
        if self.numel % self.size:
            raise ValueError(
                f"{self.name}: a reduce-scatter needs numel a multiple of the {self.size} "
                f"ranks, got {self.numel}"
            )
        shard = self.numel // self.size
        if out is not None and (
            not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.numel() != shard
        ):
            raise ValueError(f"{self.name}: out must be a float32 tensor of {shard} entries")
        return shard

    def _sparse_call(self, grad: torch.Tensor, timer: PhaseTimer) -> torch.Tensor:
        """Return the method's average of ``grad`` with error feedback (a sparse call)."""
        if self.uses_residual and not self.adds_residual:
            with timer("accumulate"):
                grad = self._residual.add_(grad)  # grad + residual, in place: no allocation
        result, self._residual = self._synchronize(grad, timer)
        return result

    def _momentum_step(self, grad: torch.Tensor) -> torch.Tensor:
        """Update the velocity u by ``grad``; return what the call synchronizes (u, or u + g)."""
        if self._velocity.device != grad.device:
            self._velocity = self._velocity.to(grad.device)
        if self._scratch is None or self._scratch.device != grad.device:
            self._scratch = torch.empty((2, self.numel), device=grad.device)
        if not self.nesterov:
            return self._velocity.mul_(self.momentum).add_(grad)
        self._velocity.add_(grad).mul_(self.momentum)
        return torch.add(self._velocity, grad, out=self._scratch[1])

    def _mask_velocity(self, before: torch.Tensor) -> None:
        """Zero u where this rank's v (``before`` the call) left its residual.

        In the two scratch rows, allocating nothing: ``before`` becomes the tolerance, the
        second row 1 where the residual is within it (Nesterov's direction there is spent).
        """
        tolerance = {"fp32": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}[self.wire]
        left = before.abs_().mul_(tolerance) if tolerance else before.zero_()
        emptied = torch.abs(self._residual, out=self._scratch[1]).le_(left)
        self._velocity.addcmul_(self._velocity, emptied, value=-1.0)  # u - u = 0 where emptied

    def _warmup_stage(self, device: torch.device) -> Synchronizer:
        """Return the synchronizer of this call's density: this one, or a warm-up stage's."""
        sparse_calls = self.calls - self.dense_warmup
        if sparse_calls >= self.density_warmup:
            self._stage = None
            return self
        density = warmup_density(sparse_calls, self.density_warmup, self.density)
        if density == self.density:
            return self
        if self._stage is None or self._stage[0] != density:
            stage = self._rebuild(density).to(device)
            self._stage = (density, stage)
        return self._stage[1]

    def check_agreement(self) -> None:
        """Compare :attr:`agreement` with every other rank's, once (a collective).

        The first :meth:`allreduce` does it, outside that call's ``stats`` (its bytes are not
        counted there); calling it right after ``compressors.create`` does it at creation.

        Raises:
            ValueError: the ranks differ, on every rank, naming the setting and the ranks.
        """
        if self.agreement is not None:
            settings, self.agreement = self.agreement, None
            check_agreement(self.transport, settings)

    @abc.abstractmethod
    def _synchronize(self, accumulated: torch.Tensor, timer: PhaseTimer):
        """Return ``(average, new_residual)`` for this rank's ``accumulated`` = grad + residual.

        ``accumulated`` is the residual buffer itself, updated in place; a method may reuse it
        as the new residual. Methods with ``uses_residual = False`` or ``adds_residual = True``
        receive the gradient instead. ``timer`` times the phases (``with timer("select"):``).
        """

    def call_kind(self, step: int) -> tuple:
        """Return the periodic work that sparse call number ``step`` does beyond every call's.

        Dense warm-up calls are not counted. Calls of one kind do the same work on other data,
        and call 0 does all of it. Every call alike here (``()``); Ok-Topk's exact calls differ.
        The simulator averages its predictions over one period (:attr:`kind_period`).
        """
        return ()

    def _after_call(self) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Hook for per-call bookkeeping of subclasses (counters, adaptive parameters)."""

    def _new_result(self, device: torch.device) -> torch.Tensor:
        """Return the zeroed result vector: the caller's ``out`` buffer if given, else a new one."""
        return zero_(self._out if self._out is not None else torch.empty(self.numel, device=device))

    def _count_nonzero(self, result: torch.Tensor) -> int | torch.Tensor | None:
        """Return the last result's non-zeros, by a pass over it; ``None`` unless ``count_nnz``.

        On a GPU a count on the device, which :attr:`stats` reads when it is read (the pass on
        the CPU has no wait to save, but must run before the caller changes the result).
        Methods that know the count without the pass override this, alike.
        """
        if not self.count_nnz:
            return None
        return count_nonzero(result) if result.device.type == "cpu" else torch.count_nonzero(result)

    def _dense_average(self, grad: torch.Tensor, timer: PhaseTimer) -> torch.Tensor:
        """Return the average of ``grad`` over the ranks by the library all-reduce.

        The sum over r of (grad_r / P), in ``out`` when given, the same bits on every rank; for
        P a power of two, bit for bit the sum divided by P. At the speed of the bare all-reduce
        of the gradient into a buffer of its own: the division writes ``grad / P`` into the
        result buffer, the copy that such an out-of-place all-reduce makes anyway, and the
        library then sums that buffer in place.
        """
        # The transports reduce contiguous buffers only.
        in_out = self._out is not None and self._out.is_contiguous()
        total = self._out if in_out else torch.empty(self.numel, device=grad.device)
        with timer("accumulate"):
            torch.div(grad, self.size, out=total)
        with timer("comm"):
            return self.transport.allreduce_sum_(total)

    def _check_gradient(self, grad, what: str = "gradient") -> None:
        if not isinstance(grad, torch.Tensor):
            raise ValueError(
                f"{self.name}: {what} must be a torch.Tensor, got {type(grad).__name__}"
            )
        if grad.layout != torch.strided or grad.device.type == "meta":
            raise ValueError(
                f"{self.name}: {what} must be a dense tensor with data, got a "
                f"{grad.layout} tensor on {grad.device}"
            )
        if grad.dtype != torch.float32:
            raise ValueError(f"{self.name}: {what} must be float32, got {grad.dtype}")
        if grad.dim() != 1 or grad.numel() != self.numel:
            raise ValueError(
                f"{self.name}: {what} must be 1-D of length {self.numel}, "
                f"got shape {tuple(grad.shape)}"
            )
        if what == "out" and grad.requires_grad:
            raise ValueError(
                f"{self.name}: out must not require grad (the result is written into it)"
            )

    def feedback_state(self) -> FeedbackState:
        """Return this synchronizer's error-feedback state, its live buffers (not copies).

        The one way out of the residual, the velocity, the call count and the method's extras
        (:class:`~compressors.state.FeedbackState`); :meth:`load_feedback` is the way in.
        """
        return FeedbackState(self._residual, self._velocity, self.calls, self._extra_state())

    def load_feedback(self, state: FeedbackState, parts=PARTS) -> None:
        """Take ``parts`` of ``state`` over (all by default), in place, on this one's device.

        The residual converts from the state's dtype (FSDP's bf16 slots); a velocity is taken
        only with momentum correction, and a state without one zeroes it. Empty extras (a
        resharded state) leave the method's own as they are: on a new synchronizer, re-derived
        at its next call.
        """
        own = FeedbackState(self._residual, self._velocity, self.calls)
        own.copy_(state, [part for part in parts if part != "extra"])
        self.calls = own.calls
        if "extra" in parts and state.extra:
            self._load_extra_state(state.extra)

    def to(self, device) -> Synchronizer:
        """Move the residual and the velocity to ``device`` (a call does it first); return self."""
        moved = FeedbackState(self._residual, self._velocity).to(device)
        self._residual, self._velocity = moved.residual, moved.velocity
        return self

    def state_dict(self) -> dict:
        """Return everything that carries across calls, on the CPU (for checkpoints).

        With the settings it depends on (``config``: method, numel, density, workers, rank, and
        the method's structural options) and the format's ``version``
        (:data:`~compressors.state.STATE_VERSION`). Tensors and plain values only: it loads with
        ``torch.load(weights_only=True)``.
        """
        return {
            "method": self.name,
            "numel": self.numel,
            "config": self._config(),
            **self.feedback_state().to_dict(),
        }

    def state_mismatch(self, state) -> str | None:
        """Return why ``state`` (a :meth:`state_dict`) cannot be loaded here, or ``None``.

        A state does not fit with another method or numel, or (states that record them) another
        density, worker count, rank or structural option (SparDL's teams and sag), which its
        adaptive parts (SparDL's h, Ok-Topk's regions) would not fit.
        """
        if (
            not isinstance(state, dict)
            or not isinstance(state.get("residual"), torch.Tensor)
            or "calls" not in state
        ):
            return "not a synchronizer state (a dict with 'residual' and 'calls')"
        try:
            FeedbackState.from_dict(state)
        except ValueError as error:
            return str(error)
        saved = dict(state.get("config", {}), method=state.get("method"), numel=state.get("numel"))
        mine = dict(self._config(), method=self.name, numel=self.numel)
        differ = [
            f"{key} {saved[key]!r} (here {value!r})"
            for key, value in mine.items()
            if key in saved and saved[key] != value
        ]
        if "method" not in saved or "numel" not in saved:
            differ.insert(0, "no method or numel recorded")
        if not differ and tuple(state["residual"].shape) != (self.numel,):
            differ.append(
                f"residual of shape {tuple(state['residual'].shape)} (here ({self.numel},))"
            )
        return "the saved synchronizer state does not fit: " + "; ".join(differ) if differ else None

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved, so the next call continues bit-identically.

        Raises:
            ValueError: the state does not fit, with :meth:`state_mismatch`'s reason.
        """
        problem = self.state_mismatch(state)
        if problem:
            raise ValueError(problem)
        # In place: a method may keep its residual as a view of a buffer of its own (spardl's
        # padded blocks), which a new tensor would cost a copy on the next call.
        self.load_feedback(FeedbackState.from_dict(state))

    def _config(self) -> dict:
        """Return the settings this rank's state depends on (subclasses add structural options)."""
        return {"density": self.density, "workers": self.size, "rank": self.rank}

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:  # noqa: B027 - optional hook, as above
        """Restore the entries :meth:`_extra_state` added (none by default)."""


def _warn_if_alone(size: int) -> None:
    """Warn once where a communicator of one rank runs under a launcher that started several.

    ``MPI.COMM_WORLD`` under torchrun (or one ``mpiexec`` per rank) is a world of one in each
    process: every rank then averages its own gradient alone, silently.
    """
    launched = os.environ.get("WORLD_SIZE", "")
    if size == 1 and launched.isdigit() and int(launched) > 1:
        warnings.warn(
            f"this synchronizer's communicator has 1 rank, but WORLD_SIZE is {launched}: each "
            "process averages alone (MPI.COMM_WORLD under torchrun?); pass the torch.distributed "
            "group (process_group=None) or launch with mpiexec",
            RuntimeWarning,
            stacklevel=3,
        )


def _shares_memory(tensor: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether ``tensor`` lives in the storage of any of ``others``."""
    pointer = tensor.untyped_storage().data_ptr()
    return any(pointer == other.untyped_storage().data_ptr() for other in others)
