"""A DDP communication hook that synchronizes every gradient bucket with any registered method.

    import hooks
    state = hooks.SparDLState(process_group=None, density=0.01, method="spardl")
    ddp_model.register_comm_hook(state, hooks.spardl_hook)

Each DDP bucket gets its own synchronizer (its own residual), created on first use; the bucket
is averaged synchronously inside the hook into a result buffer of its own, allocated once and
reused every step (DDP copies the result into the gradients before the next backward pass), and
handed back as a completed future. The residuals
travel through checkpoints with ``state.state_dict()`` / ``state.load_state_dict()``. DDP
rebuilds its buckets once after the first iteration; synchronizers are keyed by bucket index
and size, so the rebuilt buckets start with fresh residuals (a one-time event).
"""
import torch
import torch.distributed as dist

import compressors
from comm.torchdist import TorchDistributedTransport


class SparDLState:
    """State of :func:`spardl_hook`: the method, its options and one synchronizer per bucket.

    ``method``: any name of ``compressors.available()``; ``options`` go to ``compressors.create``
    (e.g. ``teams=2`` for spardl, ``dense_warmup=512``).
    """

    def __init__(self, process_group=None, density: float = 0.01, method: str = "spardl", **options) -> None:
        compressors.resolve(method)
        compressors.base.check_density(density)
        unknown = sorted(set(options) - set(compressors.options(method)))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for {method!r}; "
                             f"valid: {', '.join(compressors.options(method))}")
        self.method = method
        self.density = density
        self.options = options
        self.transport = TorchDistributedTransport(process_group)
        self.synchronizers: dict = {}
        self._results: dict = {}
        self._pending: dict = {}

    def synchronizer(self, index: int, numel: int):
        """The synchronizer of bucket ``index`` holding ``numel`` gradient elements."""
        key = f"{index}:{numel}"
        if key not in self.synchronizers:
            sync = compressors.create(self.method, self.transport, numel=numel, density=self.density,
                                      **self.options)
            if key in self._pending:
                sync.load_state_dict(self._pending.pop(key))
            self.synchronizers[key] = sync
        return self.synchronizers[key]

    def result_buffer(self, index: int, like: torch.Tensor) -> torch.Tensor:
        """The float32 buffer, on ``like``'s device, that receives bucket ``index``'s average
        every step (one per bucket, allocated on first use)."""
        key = f"{index}:{like.numel()}"
        buffer = self._results.get(key)
        if buffer is None or buffer.device != like.device:
            buffer = self._results[key] = torch.empty(like.numel(), device=like.device)
        return buffer

    def state_dict(self) -> dict:
        """Every bucket synchronizer's state (residuals, thresholds, counters), on the CPU."""
        states = dict(self._pending)
        states.update({key: sync.state_dict() for key, sync in self.synchronizers.items()})
        return {"method": self.method, "density": self.density, "buckets": states}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; buckets not built yet pick their state up when they are."""
        if state.get("method") != self.method:
            raise ValueError(f"state of method {state.get('method')!r} does not fit {self.method!r}")
        self._pending = dict(state["buckets"])
        for key, sync in self.synchronizers.items():
            if key in self._pending:
                sync.load_state_dict(self._pending.pop(key))


def spardl_hook(state: SparDLState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over the group with ``state``'s method."""
    flat = bucket.buffer()
    sync = state.synchronizer(bucket.index(), flat.numel())
    averaged = sync.allreduce(flat if flat.dtype == torch.float32 else flat.float(),
                              out=state.result_buffer(bucket.index(), flat))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(averaged.to(flat.dtype))
    return future
