"""Sparse gradient synchronization for FSDP2 (``torch.distributed.fsdp.fully_shard``).

Two seams of FSDP2 take it:

* :class:`SparseReduceScatter`, an FSDP2 ``ReduceScatter`` for
  ``FSDPModule.set_custom_reduce_scatter``: each parameter group's flat gradient, P equal
  shards, is reduced with any registered method and each rank keeps its own shard. SparDL runs
  its Spar-Reduce-Scatter alone (``SparDL.reduce_scatter``: no Spar-All-Gather, no final
  gather); every other method runs its all-reduce and keeps the own shard.
* :func:`sparse_replica_hook`, for ``FSDPModule.set_all_reduce_hook`` in sparse hybrid
  sharding: FSDP shards over the ranks of one host, and the hook averages each reduce-scatter
  output across the hosts (the ranks of the same local index) with any registered method, in
  place. :func:`host_groups` builds the two groups.

Each synchronizer keeps an error-feedback residual of its vector's size: the unsharded
parameter group's size for the reduce-scatter (P times the shard FSDP keeps: 4 bytes per
parameter per rank), the shard's for the replica hook. Give every FSDP module an instance of
its own (:func:`attach` does), so that no two parameter groups share a residual.
``residual_dtype="bf16"`` halves that memory: each instance keeps its residual in bf16 (2 bytes
per entry) and the instances of one :func:`attach` share their float32 synchronizers, one per
distinct vector length; the bf16 rounding of the residual is mass lost
(:class:`SparseReduceScatter`). docs/FSDP.md shows the ways in.

    from compressors.fsdp import attach
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    comms = attach(model, "spardl", density=0.01)   # one SparseReduceScatter per FSDP module
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import compressors
from allreducers.checks import check_choice
from allreducers.transports import Transport
from allreducers.transports.torchdist import TorchDistributedTransport

from .fsdp_layout import group_shapes, padded_numel
from .state import FeedbackState

__all__ = [
    "ReduceScatter",
    "RESIDUAL_DTYPES",
    "SparseReduceScatter",
    "SparseReplicaHook",
    "sparse_replica_hook",
    "host_groups",
    "attach",
    "module_shapes",
]

try:  # FSDP2's interface; its module moved between releases
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # pragma: no cover - older torch: a plain base class
    ReduceScatter = object

#: How a parameter group's residual is stored between calls (``residual_dtype``).
RESIDUAL_DTYPES = ("fp32", "bf16")


class _Synchronizers:
    """One synchronizer per vector length over one group, built at first use, with state."""

    def __init__(self, method: str, group, density: float, options: dict) -> None:
        self.method = compressors.resolve(method).name
        self.density = compressors.base.check_density(density)
        compressors.registry.check_known(self.method, options)
        self.group = group
        self.options = dict(options)
        self.syncs: dict = {}  # numel -> synchronizer
        self.fresh: dict = {}  # numel -> the method's extra state of a synchronizer never called
        self._saved: dict = {}  # numel -> state not loaded yet
        self._transport = None

    def get(self, numel: int, group=None):
        """Return the synchronizer of vectors of ``numel`` entries over ``group`` (or ours).

        The group may also be a transport (``allreducers.transports``), as in tests.
        """
        sync = self.syncs.get(numel)
        if sync is None:
            if self._transport is None:
                group = self.group if self.group is not None else group
                self._transport = (
                    group if isinstance(group, Transport) else TorchDistributedTransport(group)
                )
            sync = compressors.create(
                self.method, self._transport, numel=numel, density=self.density, **self.options
            )
            sync.count_nnz = False
            self.fresh[numel] = sync.feedback_state().extra
            if numel in self._saved:
                sync.load_state_dict(self._saved.pop(numel))
            self.syncs[numel] = sync
        return sync

    def check(self, state: dict, residual_dtype: str = "fp32") -> None:
        """Refuse a state saved with another method, density or residual dtype."""
        saved = (state.get("method"), state.get("density"), state.get("residual_dtype", "fp32"))
        if saved != (self.method, self.density, residual_dtype):
            raise ValueError(
                f"the saved state is of {saved[0]} at density {saved[1]} with "
                f"residual_dtype={saved[2]!r}, this one {self.method} at {self.density} with "
                f"residual_dtype={residual_dtype!r}"
            )

    def state_dict(self) -> dict:
        states = {numel: sync.state_dict() for numel, sync in self.syncs.items()}
        return {"method": self.method, "density": self.density, "synchronizers": states}

    def load_state_dict(self, state: dict) -> None:
        self.check(state)
        self._saved = dict(state["synchronizers"])
        for numel in list(self._saved):
            if numel in self.syncs:
                self.syncs[numel].load_state_dict(self._saved.pop(numel))


class _Slot:
    """One parameter group's state between calls, its residual in bf16, for a shared synchronizer.

    A :class:`~compressors.state.FeedbackState` (``dtype="bf16"``): the call count, the
    method's extra state (SparDL's adaptive height, Ok-Topk's thresholds), the residual (bf16)
    and momentum correction's velocity (float32). :meth:`load` puts it into the shared
    synchronizer before a call, :meth:`store` takes it back after.
    """

    def __init__(self, numel: int, extra: dict) -> None:
        self.state = FeedbackState.zeros(numel, dtype="bf16", extra=extra)
        self.pending = None  # a loaded state, checked against the synchronizer at first use

    @property
    def residual(self) -> torch.Tensor:
        """The group's residual, bf16."""
        return self.state.residual

    @classmethod
    def from_state(cls, state: dict) -> _Slot:
        """The slot of a synchronizer state (``state_dict``; its residual rounded to bf16)."""
        saved = FeedbackState.from_dict(state)
        slot = cls(saved.numel, {})
        if saved.velocity is not None:
            slot.state.velocity = torch.zeros(saved.numel)
        slot.state.copy_(saved)
        slot.pending = state
        return slot

    def load(self, sync, device: torch.device) -> None:
        """Make ``sync`` continue this group (its residual loaded in place, in float32)."""
        if self.pending is not None:
            problem = sync.state_mismatch(self.pending)
            if problem:
                raise ValueError(problem)
            self.pending = None
        if sync.momentum and self.state.velocity is None:
            self.state.velocity = torch.zeros(sync.numel)
        sync.to(device).load_feedback(self.state.to(device))

    def store(self, sync) -> None:
        """Take this group's state back from ``sync`` after a call (its residual rounded)."""
        self.state.copy_(sync.feedback_state())

    def state_dict(self, sync) -> dict:
        """This group's synchronizer state, its residual in bf16, on the CPU."""
        if self.pending is not None:  # loaded, not used yet
            state = dict(self.pending)
        else:
            self.load(sync, self.residual.device)
            state = sync.state_dict()
        return dict(state, residual=self.residual.detach().cpu().clone(), dtype="bf16")


class _Sparse:
    """What the reduce-scatter and the replica hook share: synchronizers and residual storage."""

    def __init__(self, method, group, density, residual_dtype, options) -> None:
        self.residual_dtype = check_choice("residual_dtype", residual_dtype, RESIDUAL_DTYPES)
        self._syncs = _Synchronizers(method, group, density, options)
        self._slots = {} if self.residual_dtype == "bf16" else None  # numel -> _Slot
        #: The shapes of the parameter group's parameters in FSDP2's order (:func:`attach`
        #: sets them; ``compressors.fsdp_layout``), which let ``compressors.reshard`` map the
        #: residuals to another number of ranks; ``None``: not known.
        self.shapes = None
        self._layouts: dict = {}  # numel -> the shapes its vectors were laid out from, or None

    @property
    def synchronizers(self) -> dict:
        """The synchronizers built so far, by vector length (bf16: shared with siblings)."""
        return self._syncs.syncs

    @property
    def residuals(self) -> dict:
        """This instance's residuals, by vector length (float32, or bf16 as stored)."""
        if self._slots is None:
            return {numel: sync.residual for numel, sync in self._syncs.syncs.items()}
        return {numel: slot.residual for numel, slot in self._slots.items()}

    def sibling(self):
        """Return a new instance with the same settings, for another parameter group.

        With ``residual_dtype="bf16"`` it shares this one's float32 synchronizers (one per
        vector length) and keeps its own bf16 residuals; with ``"fp32"`` it is independent.
        Share only between groups whose calls never overlap (FSDP runs one reduce-scatter at
        a time per process; :func:`attach` makes siblings).
        """
        twin = copy.copy(self)
        twin.shapes, twin._layouts = None, {}
        if self._slots is None:
            syncs = self._syncs
            twin._syncs = _Synchronizers(syncs.method, syncs.group, syncs.density, syncs.options)
        else:
            twin._slots = {}
        return twin

    def _run(self, numel: int, group, call, flat: torch.Tensor) -> torch.Tensor:
        """Return ``call(sync, flat)`` with the synchronizer of ``numel`` and this group's state."""
        sync = self._syncs.get(numel, group)
        if self._slots is None:
            return call(sync, flat)
        slot = self._slots.get(numel)
        if slot is None:
            slot = self._slots[numel] = _Slot(numel, self._syncs.fresh[numel])
        slot.load(sync, flat.device)
        result = call(sync, flat)
        slot.store(sync)
        return result

    def state_dict(self) -> dict:
        """This rank's residuals (and each synchronizer's state), by vector length."""
        if self._slots is None:
            return self._syncs.state_dict()
        states = {
            numel: slot.state_dict(self._syncs.syncs.get(numel))
            for numel, slot in self._slots.items()
        }
        return {
            "method": self._syncs.method,
            "density": self._syncs.density,
            "residual_dtype": self.residual_dtype,
            "synchronizers": states,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (a synchronizer not built yet loads when it is).

        Raises:
            ValueError: the state is of another method, density or ``residual_dtype``, or (now
                or at the first call) does not fit the synchronizer.
        """
        if self._slots is None:
            self._syncs.load_state_dict(state)
            return
        self._syncs.check(state, self.residual_dtype)
        slots = {numel: _Slot.from_state(saved) for numel, saved in state["synchronizers"].items()}
        for numel, slot in slots.items():
            sync = self._syncs.syncs.get(numel)
            if sync is None:  # the first to build it loads the whole state (SparDL's choice)
                self._syncs._saved.setdefault(numel, slot.pending)
            else:
                slot.load(sync, slot.residual.device)
        self._slots = slots


def _factor(op, size: int) -> float:
    """The factor that turns an average over ``size`` ranks into FSDP's ``op`` reduction."""
    if op == dist.ReduceOp.AVG:
        return 1.0
    if op == dist.ReduceOp.SUM:
        return float(size)
    raise ValueError(
        f"SparseReduceScatter reduces with AVG or SUM, not {op}: with "
        "set_gradient_divide_factor, also call set_force_sum_reduction_for_comms(True) so that "
        "FSDP divides after the reduction"
    )


class SparseReduceScatter(_Sparse, ReduceScatter):
    """FSDP2's reduce-scatter done by a registered method (``set_custom_reduce_scatter``).

    Args:
        method: any name of ``compressors.available()``; SparDL (with one team, the default)
            runs its Spar-Reduce-Scatter alone.
        group: the ``torch.distributed`` group (``None``: the one FSDP passes, its shard group),
            or an ``allreducers.transports.Transport`` (in-process ranks, as in tests).
        density: the fraction of each parameter group's gradient kept, in (0, 1].
        residual_dtype: how the residual is kept between calls: ``"fp32"`` (default) or
            ``"bf16"``.
        **options: the method's options (``compressors.options(method)``), e.g. ``wire="fp16"``.

    The input is FSDP's flat unsharded gradient of one parameter group (P shards, rank r's
    shard r), the output rank r's shard of the reduction FSDP asks for (``ReduceOp.AVG`` or
    ``SUM``). Other dtypes (bf16 under mixed precision) are reduced in float32 and cast back.
    At density 1 the result is FSDP's own reduce-scatter's up to float rounding.

    The residual has the unsharded size of the parameter group: with ``"fp32"`` 4 bytes per
    parameter on every rank, in the synchronizer (plus its work buffers). With ``"bf16"`` this
    instance keeps it in bf16, 2 bytes per parameter, and its :meth:`sibling` instances (those
    of one :func:`attach`) share one float32 synchronizer per distinct parameter-group size,
    which loads the group's residual before a call and whose residual is rounded back to bf16
    after it. That rounding is the mass bf16 storage loses: per entry at most half a bf16 unit
    in the last place of the float32 residual r, |r - bf16(r)| <= 2^-8 |r| (bf16 keeps 8
    significant bits, float32's exponent range), every call; everything else is conserved as
    the method conserves it. Momentum correction's velocity stays float32, one per group.
    Each group's call count and method state (``state_dict``'s) go in and out with its
    residual, so a group gets what a synchronizer of its own would give it; not so a density
    warm-up stage's method state (Ok-Topk's thresholds at ``density_warmup``), which the groups
    of one size share (a ``state_dict`` does not hold it either).

    Raises:
        ValueError: an unknown method or option, an invalid density or ``residual_dtype``; at
            a call, another reduction op than AVG or SUM.
    """

    def __init__(
        self,
        method: str = "spardl",
        group=None,
        density: float = 0.01,
        residual_dtype: str = "fp32",
        **options,
    ):
        super().__init__(method, group, density, residual_dtype, options)

    def state_dict(self) -> dict:
        """This rank's residuals by vector length (see :class:`_Sparse`), with the layouts.

        ``layouts``: per vector length the shapes of the group's parameters it was laid out
        from (``compressors.fsdp_layout``), ``None`` where they were not known; what
        ``compressors.reshard`` needs to map the residuals to another number of ranks.
        """
        state = super().state_dict()
        layouts = {numel: self._layouts.get(numel) for numel in state["synchronizers"]}
        return dict(state, seam="reduce_scatter", layouts=layouts)

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (see :class:`_Sparse`), its layouts with it."""
        super().load_state_dict(state)
        self._layouts.update(state.get("layouts") or {})

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Return an uninitialized buffer of ``size`` (FSDP's ``Comm.allocate``)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor, input_tensor, group=None, op=dist.ReduceOp.AVG, async_op=False
    ):
        """Reduce ``input_tensor`` over the group into this rank's shard ``output_tensor``.

        Runs to completion (``async_op`` or not) and returns ``None``.
        """
        numel = input_tensor.numel()
        size = self._syncs.get(numel, group).size
        factor = _factor(op, size)
        if numel not in self._layouts:  # the shapes, where they give FSDP's vector its length
            fits = self.shapes is not None and padded_numel(self.shapes, size) == numel
            self._layouts[numel] = [list(shape) for shape in self.shapes] if fits else None
        flat = input_tensor.reshape(-1)
        if flat.dtype != torch.float32:
            flat = flat.float()
        shard = self._run(numel, group, lambda sync, grad: sync.reduce_scatter(grad), flat)
        if factor != 1.0:
            shard.mul_(factor)
        output_tensor.reshape(-1).copy_(shard)
        return None


class SparseReplicaHook(_Sparse):
    """The hook :func:`sparse_replica_hook` returns: an in-place sparse average across replicas."""

    def __init__(
        self, method: str, group, density: float, options: dict, residual_dtype: str = "fp32"
    ) -> None:
        super().__init__(method, group, density, residual_dtype, options)

    def __call__(self, reduce_output: torch.Tensor) -> None:
        """Average ``reduce_output`` (this rank's shard) over the replica group, in place."""
        flat = reduce_output.reshape(-1)
        grad = flat if flat.dtype == torch.float32 and flat.is_contiguous() else flat.float()
        average = self._run(flat.numel(), None, lambda sync, g: sync.allreduce(g), grad)
        flat.copy_(average)


def sparse_replica_hook(
    method: str = "spardl", group=None, density: float = 0.01, residual_dtype="fp32", **options
) -> SparseReplicaHook:
    """Return a hook for ``FSDPModule.set_all_reduce_hook``: sparse hybrid sharding.

    FSDP shards over ``fully_shard``'s mesh (the ranks of one host); the hook then averages
    each reduce-scatter output across ``group``, the ranks holding the same shard on the other
    hosts (:func:`host_groups`), with ``method``, in place. FSDP's reduce-scatter already
    averaged over the host, so the result is the average over every rank. ``residual_dtype``
    as for :class:`SparseReduceScatter`, with the shard's size.

    Raises:
        ValueError: an unknown method or option, or an invalid density or ``residual_dtype``.
    """
    return SparseReplicaHook(method, group, density, options, residual_dtype)


def host_groups(ranks_per_host: int) -> tuple:
    """Return ``(shard group, replica group)`` of this rank (collective: every rank calls it).

    Hosts hold consecutive ranks, ``ranks_per_host`` each: the shard group is this rank's host,
    the replica group the ranks with this rank's local index on every host.

    Raises:
        ValueError: ``ranks_per_host`` does not divide the world size.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if ranks_per_host < 1 or world % ranks_per_host:
        raise ValueError(f"ranks_per_host {ranks_per_host} must divide the world size {world}")
    hosts = world // ranks_per_host
    shard = replica = None
    for host in range(hosts):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(host * ranks_per_host, (host + 1) * ranks_per_host)))
        if rank // ranks_per_host == host:
            shard = group
    for local in range(ranks_per_host):
        group = dist.new_group([host * ranks_per_host + local for host in range(hosts)])
        if rank % ranks_per_host == local:
            replica = group
    return shard, replica


def module_shapes(module) -> list | None:
    """Return the shapes of the parameters FSDP2 reduces for the FSDP module ``module``.

    In FSDP2's order (``compressors.fsdp_layout.group_shapes``): a reduce-scatter's ``shapes``.
    """
    return group_shapes(module, lambda m: isinstance(m, FSDPModule))


def attach(
    model,
    method: str = "spardl",
    density: float = 0.01,
    *,
    replica_group=None,
    residual_dtype: str = "fp32",
    **options,
):
    """Give every FSDP module of ``model`` a sparse synchronizer of its own; return them.

    Without ``replica_group``: a :class:`SparseReduceScatter` each (``set_custom_reduce_scatter``).
    With it: a :func:`sparse_replica_hook` each (``set_all_reduce_hook``), for sparse hybrid
    sharding. Returns ``{module name: comm or hook}`` (``""`` for ``model`` itself), whose
    ``state_dict`` a checkpoint saves. With ``residual_dtype="bf16"`` each keeps its residuals
    in bf16 and they all share one float32 synchronizer per distinct parameter-group size
    (:meth:`SparseReduceScatter.sibling`).

    Raises:
        ValueError: ``model`` holds no FSDP module, or as the classes above.
    """
    check_choice("residual_dtype", residual_dtype, RESIDUAL_DTYPES)
    attached = {}
    first = None
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        if first is not None:
            comm = first.sibling()
        elif replica_group is None:
            comm = first = SparseReduceScatter(method, None, density, residual_dtype, **options)
        else:
            comm = first = sparse_replica_hook(
                method, replica_group, density, residual_dtype, **options
            )
        if replica_group is None:
            comm.shapes = module_shapes(module)
            module.set_custom_reduce_scatter(comm)
        else:
            module.set_all_reduce_hook(comm)
        attached[name] = comm
    if not attached:
        raise ValueError("attach: the model holds no FSDP module (call fully_shard first)")
    return attached
