"""The trainer's sharded data parallelism: FSDP2, native or sparse, and hybrid sharding.

:class:`FSDPSync` shards the model with ``fully_shard`` (each child module with parameters,
then the root) and stands where the trainer's overlapped synchronizer stands (``finish`` after
backward, ``stats``, ``state_dict``, ``state_mismatch``), as ``DDPSync`` does for DDP. Its
checkpoints hold the whole model and optimizer state, gathered from the shards (every rank
keeps its own residuals), so a sharded run resumes like any other.

* ``--fsdp``: shards over every rank; with a method, each FSDP module reduces its gradient
  through a ``compressors.fsdp.SparseReduceScatter`` (SparDL: Spar-Reduce-Scatter alone).
* ``--hsdp``: shards within a host and replicates across hosts. Natively FSDP2's 2-D mesh
  (reduce-scatter in the host, all-reduce across); with a method, FSDP shards over the host
  and ``compressors.fsdp.sparse_replica_hook`` averages each shard across the hosts.
* ``--residual-dtype bf16`` (with a method): each FSDP module keeps its error-feedback residual
  in bf16, and the modules share float32 synchronizers, one per distinct vector length (as
  ``compressors.fsdp.attach`` makes them: each module's comm a ``sibling`` of the first).

How it measures: the gradient reductions run inside backward (on the CPU nothing overlaps
them), so a step's synchronization is the time spent in them, timed around each reduce-scatter
and replica all-reduce, and compute is backward's time without it. Bytes are the gradient
reductions' (a sparse method's own count; natively (P - 1)/P of each reduce-scatter input and
an all-reduce's 2 (R - 1)/R of each shard across R hosts); the parameter all-gathers, the same
for every method, are not counted.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from compressors.fsdp import (
    ReduceScatter,
    SparseReduceScatter,
    host_groups,
    module_shapes,
    sparse_replica_hook,
)
from compressors.stats import call_record, summed
from trainer.checkpoint import mode_mismatch
from trainer.flat import StepDefaults
from trainer.torch_ddp import allreduce_bytes, start_group


class _Clock:
    """One step's gradient reductions: their records (``compressors.stats``) and seconds."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.records: list = []

    def timed(self, action, record):
        """Run ``action()`` and keep ``record(seconds it took)``, read after the call."""
        started = time.perf_counter()
        result = action()
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.records.append(record(elapsed))
        return result


def _native_record(nbytes: float, seconds: dict | None = None) -> dict:
    """The record of a reduction this rank sent ``nbytes`` in (its traffic known, not counted)."""
    return call_record({"bytes_sent": nbytes}, None, seconds or {})


class _NativeReduceScatter(ReduceScatter):
    """FSDP's own reduce-scatter (``reduce_scatter_single``, as FSDP's default), timed."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor, input_tensor, group=None, op=dist.ReduceOp.AVG, async_op=False
    ):
        size = dist.get_world_size(group)
        nbytes = input_tensor.numel() * input_tensor.element_size() * (size - 1) / size
        self.clock.timed(  # all of its time is communication
            lambda: dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group),
            lambda elapsed: _native_record(nbytes, {"comm": elapsed, "total": elapsed}),
        )
        return None


class _TimedReduceScatter(_NativeReduceScatter):
    """A :class:`SparseReduceScatter`, timed and counted."""

    def __init__(self, inner: SparseReduceScatter, clock: _Clock) -> None:
        self.inner, self.clock = inner, clock

    def __call__(
        self, output_tensor, input_tensor, group=None, op=dist.ReduceOp.AVG, async_op=False
    ):
        stats = lambda _: self.inner.synchronizers[input_tensor.numel()].stats  # noqa: E731
        self.clock.timed(lambda: self.inner(output_tensor, input_tensor, group, op), stats)


def _timed_hook(hook, clock: _Clock):
    """A sparse replica hook, timed and counted."""

    def timed(reduce_output):
        stats = lambda _: hook.synchronizers[reduce_output.numel()].stats  # noqa: E731
        clock.timed(lambda: hook(reduce_output), stats)

    return timed


def ranks_per_host(comm, topology) -> int:
    """The ranks of one host: the cluster topology's, else the launcher's ranks sharing memory."""
    if topology and topology.get("ranks_per_host"):
        return int(topology["ranks_per_host"])
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()


class FSDPSync(StepDefaults):
    """The model sharded by FSDP2, natively or with a sparse method; the trainer's synchronizer.

    Args:
        comm: the ``mpi4py`` communicator (its ranks become the ``torch.distributed`` group).
        model: the module on ``device``, with rank 0's weights on every rank; sharded in place.
        method: a registered method's name, or ``None`` for FSDP's own reduction.
        density, options: the method's density and options.
        device: the rank's device.
        per_host: ``None`` for ``--fsdp``; for ``--hsdp``, the ranks of one host.
        residual_dtype: how a method's residuals are kept, ``"fp32"`` or ``"bf16"``
            (``compressors.fsdp.RESIDUAL_DTYPES``); FSDP's own reduction keeps none.

    Attributes:
        numel, name, density, stats: as the trainer's other synchronizers.
        residual_dtype: the residuals' storage (``"fp32"`` natively).
    """

    def __init__(
        self, comm, model, method, density, options, device, per_host=None, residual_dtype="fp32"
    ) -> None:
        start_group(comm, device)
        self.name = method or "native"
        self.density = density if method else 1.0
        self.residual_dtype = residual_dtype if method else "fp32"
        self.options = dict(options or {})
        self.size = comm.Get_size()
        self.per_host = per_host
        self.forward_model = model  # sharded in place below
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self._parameters)
        self._clock = _Clock()
        mesh, replica_group = None, None
        if per_host is not None:
            hosts = self.size // per_host
            if method is None:  # FSDP2's own HSDP: (replicate, shard)
                mesh = init_device_mesh(device.type, (hosts, per_host), mesh_dim_names=("r", "s"))
            else:
                shard_group, replica_group = host_groups(per_host)
                mesh = DeviceMesh.from_group(shard_group, device.type)
        for child in model.children():
            if any(p.requires_grad for p in child.parameters()):
                fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.comms = {}
        first = None  # the first module's comm: the others are its siblings (bf16: shared syncs)
        for name, module in model.named_modules():
            if not isinstance(module, FSDPModule):
                continue
            if method is None:
                module.set_custom_reduce_scatter(_NativeReduceScatter(self._clock))
                if per_host is not None:
                    module.set_all_reduce_hook(self._native_replica_bytes(hosts))
                continue
            if first is not None:
                comm_ = first.sibling()
            elif per_host is None:
                comm_ = first = SparseReduceScatter(
                    method, None, density, self.residual_dtype, **self.options
                )
            else:
                comm_ = first = sparse_replica_hook(
                    method, replica_group, density, self.residual_dtype, **self.options
                )
            if per_host is None:  # its parameters' shapes: what a reshard to another P needs
                comm_.shapes = module_shapes(module)
                module.set_custom_reduce_scatter(_TimedReduceScatter(comm_, self._clock))
            else:
                module.set_custom_reduce_scatter(_NativeReduceScatter(self._clock))
                module.set_all_reduce_hook(_timed_hook(comm_, self._clock))
            self.comms[name] = comm_
        self.stats = self._stats(None)

    def _native_replica_bytes(self, hosts):
        """Count native HSDP's all-reduce across the hosts (it runs inside FSDP, untimed)."""

        def count(reduce_output):
            nbytes = allreduce_bytes(reduce_output.numel(), reduce_output.element_size(), hosts)
            self._clock.records.append(_native_record(nbytes))

        return count

    def _stats(self, compute_end) -> dict:
        """The protocol's stats: the step's reductions summed (``compressors.stats``)."""
        clock = self._clock
        return {
            **summed(list(clock.records)),
            "sync_seconds": clock.seconds,
            "compute_end": compute_end,
        }

    overlaps_backward = True

    def finish(self, agree) -> None:
        """After backward (every shard's gradient reduced): take the step's stats, then
        ``agree`` with whether every rank's gradient shards are finite (one small all-reduce:
        shards differ per rank)."""
        now = time.perf_counter()
        self.stats = self._stats(now - self._clock.seconds)
        self._clock.reset()
        grads = [p.grad.to_local() for p in self._parameters if p.grad is not None]
        finite = torch.tensor(
            [float(all(bool(torch.isfinite(g).all()) for g in grads))], dtype=torch.float32
        )
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        agree(finite=bool(finite.item()))

    def training_state(self, model, optimizer) -> tuple:
        """Return the whole model's and optimizer's state, gathered from the shards on every
        rank (collective): plain tensors, as an unsharded run's checkpoint holds them."""
        options = StateDictOptions(full_state_dict=True)
        return (
            get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizer, options=options),
        )

    def load_training_state(self, model, optimizer, model_state, optimizer_state) -> None:
        """Restore :meth:`training_state`'s states: every rank keeps its own shards of them."""
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, model_state, options=options)
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)

    def state_dict(self) -> dict:
        """The mode, the method, the residuals' dtype and each FSDP module's residuals (sparse
        methods)."""
        return {
            "overlap": True,
            "fsdp": "hsdp" if self.per_host else "fsdp",
            "method": self.name,
            "numel": self.numel,
            "residual_dtype": self.residual_dtype,
            "comms": {name: comm.state_dict() for name, comm in self.comms.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s residuals."""
        for name, comm in self.comms.items():
            if name in state.get("comms", {}):
                comm.load_state_dict(state["comms"][name])

    def state_mismatch(self, state) -> str | None:
        """Why ``state`` cannot be loaded here, or ``None``: another mode or method, or
        residuals kept in another dtype (a state saved before ``residual_dtype`` existed: the
        dtype its modules' states record, float32 without one)."""
        mode = "hsdp" if self.per_host else "fsdp"
        problem = mode_mismatch(state, "fsdp", mode, f"a run without --{mode}", self.name)
        if problem or not self.comms:
            return problem
        saved = state.get("residual_dtype") or next(
            (
                comm["residual_dtype"]
                for comm in state.get("comms", {}).values()
                if isinstance(comm, dict) and "residual_dtype" in comm
            ),
            "fp32",
        )
        if saved != self.residual_dtype:
            return f"residual_dtype {saved} (this run: {self.residual_dtype}, --residual-dtype)"
        return None
