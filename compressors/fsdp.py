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
its own (:func:`attach` does), so that no two parameter groups share a residual. docs/FSDP.md
shows the ways in.

    from compressors.fsdp import attach
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    comms = attach(model, "spardl", density=0.01)   # one SparseReduceScatter per FSDP module
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import compressors
from allreducers.transports.torchdist import TorchDistributedTransport

try:  # FSDP2's interface; its module moved between releases
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # pragma: no cover - older torch: a plain base class
    ReduceScatter = object


class _Synchronizers:
    """One synchronizer per vector length over one group, built at first use, with state."""

    def __init__(self, method: str, group, density: float, options: dict) -> None:
        self.method = compressors.resolve(method).name
        self.density = compressors.base.check_density(density)
        compressors.registry.check_known(self.method, options)
        self.group = group
        self.options = dict(options)
        self.syncs: dict = {}  # numel -> synchronizer
        self._saved: dict = {}  # numel -> state not loaded yet
        self._transport = None

    def get(self, numel: int, group=None):
        """Return the synchronizer of vectors of ``numel`` entries over ``group`` (or ours)."""
        sync = self.syncs.get(numel)
        if sync is None:
            if self._transport is None:
                self._transport = TorchDistributedTransport(
                    self.group if self.group is not None else group
                )
            sync = compressors.create(
                self.method, self._transport, numel=numel, density=self.density, **self.options
            )
            sync.count_nnz = False
            if numel in self._saved:
                sync.load_state_dict(self._saved.pop(numel))
            self.syncs[numel] = sync
        return sync

    def state_dict(self) -> dict:
        states = {numel: sync.state_dict() for numel, sync in self.syncs.items()}
        return {"method": self.method, "density": self.density, "synchronizers": states}

    def load_state_dict(self, state: dict) -> None:
        if state.get("method") != self.method or state.get("density") != self.density:
            raise ValueError(
                f"the saved state is of {state.get('method')} at density "
                f"{state.get('density')}, this one {self.method} at {self.density}"
            )
        self._saved = dict(state["synchronizers"])
        for numel in list(self._saved):
            if numel in self.syncs:
                self.syncs[numel].load_state_dict(self._saved.pop(numel))


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


class SparseReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter done by a registered method (``set_custom_reduce_scatter``).

    Args:
        method: any name of ``compressors.available()``; SparDL (with one team, the default)
            runs its Spar-Reduce-Scatter alone.
        group: the ``torch.distributed`` group (``None``: the one FSDP passes, its shard group).
        density: the fraction of each parameter group's gradient kept, in (0, 1].
        **options: the method's options (``compressors.options(method)``), e.g. ``wire="fp16"``.

    The input is FSDP's flat unsharded gradient of one parameter group (P shards, rank r's
    shard r), the output rank r's shard of the reduction FSDP asks for (``ReduceOp.AVG`` or
    ``SUM``). Other dtypes (bf16 under mixed precision) are reduced in float32 and cast back.
    At density 1 the result is FSDP's own reduce-scatter's up to float rounding.

    Raises:
        ValueError: an unknown method or option, an invalid density; at a call, another
            reduction op than AVG or SUM.
    """

    def __init__(self, method: str = "spardl", group=None, density: float = 0.01, **options):
        self._syncs = _Synchronizers(method, group, density, options)

    @property
    def synchronizers(self) -> dict:
        """The synchronizers built so far, by the length of their parameter group's gradient."""
        return self._syncs.syncs

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Return an uninitialized buffer of ``size`` (FSDP's ``Comm.allocate``)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor, input_tensor, group=None, op=dist.ReduceOp.AVG, async_op=False
    ):
        """Reduce ``input_tensor`` over the group into this rank's shard ``output_tensor``.

        Runs to completion (``async_op`` or not) and returns ``None``.
        """
        sync = self._syncs.get(input_tensor.numel(), group)
        factor = _factor(op, sync.size)
        flat = input_tensor.reshape(-1)
        if flat.dtype != torch.float32:
            flat = flat.float()
        shard = sync.reduce_scatter(flat)
        if factor != 1.0:
            shard.mul_(factor)
        output_tensor.reshape(-1).copy_(shard)
        return None

    def state_dict(self) -> dict:
        """This rank's residuals (and each synchronizer's state), by parameter-group length."""
        return self._syncs.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (each synchronizer loads when it is built)."""
        self._syncs.load_state_dict(state)


class SparseReplicaHook:
    """The hook :func:`sparse_replica_hook` returns: an in-place sparse average across replicas."""

    def __init__(self, method: str, group, density: float, options: dict) -> None:
        self._syncs = _Synchronizers(method, group, density, options)

    @property
    def synchronizers(self) -> dict:
        """The synchronizers built so far, by the length of their shard."""
        return self._syncs.syncs

    def __call__(self, reduce_output: torch.Tensor) -> None:
        """Average ``reduce_output`` (this rank's shard) over the replica group, in place."""
        flat = reduce_output.reshape(-1)
        sync = self._syncs.get(flat.numel())
        grad = flat if flat.dtype == torch.float32 and flat.is_contiguous() else flat.float()
        average = sync.allreduce(grad)
        flat.copy_(average)

    def state_dict(self) -> dict:
        """This rank's residuals (and each synchronizer's state), by shard length."""
        return self._syncs.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (each synchronizer loads when it is built)."""
        self._syncs.load_state_dict(state)


def sparse_replica_hook(
    method: str = "spardl", group=None, density: float = 0.01, **options
) -> SparseReplicaHook:
    """Return a hook for ``FSDPModule.set_all_reduce_hook``: sparse hybrid sharding.

    FSDP shards over ``fully_shard``'s mesh (the ranks of one host); the hook then averages
    each reduce-scatter output across ``group``, the ranks holding the same shard on the other
    hosts (:func:`host_groups`), with ``method``, in place. FSDP's reduce-scatter already
    averaged over the host, so the result is the average over every rank.

    Raises:
        ValueError: an unknown method or option, or an invalid density.
    """
    return SparseReplicaHook(method, group, density, options)


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


def attach(model, method: str = "spardl", density: float = 0.01, *, replica_group=None, **options):
    """Give every FSDP module of ``model`` a sparse synchronizer of its own; return them.

    Without ``replica_group``: a :class:`SparseReduceScatter` each (``set_custom_reduce_scatter``).
    With it: a :func:`sparse_replica_hook` each (``set_all_reduce_hook``), for sparse hybrid
    sharding. Returns ``{module name: comm or hook}`` (``""`` for ``model`` itself), whose
    ``state_dict`` a checkpoint saves.

    Raises:
        ValueError: ``model`` holds no FSDP module, or as the classes above.
    """
    attached = {}
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        if replica_group is None:
            comm = SparseReduceScatter(method, None, density, **options)
            module.set_custom_reduce_scatter(comm)
        else:
            comm = sparse_replica_hook(method, replica_group, density, **options)
            module.set_all_reduce_hook(comm)
        attached[name] = comm
    if not attached:
        raise ValueError("attach: the model holds no FSDP module (call fully_shard first)")
    return attached
