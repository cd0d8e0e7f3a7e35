"""A DDP communication hook that synchronizes every gradient bucket with any registered method.

    from compressors.ddp import SparDLState, spardl_hook
    state = SparDLState(process_group=None, density=0.01, method="spardl", model=ddp_model)
    ddp_model.register_comm_hook(state, spardl_hook)

How residuals follow their parameters when DDP rebuilds its buckets, and what the hook
guarantees, is in docs/DESIGN.md, section "The DDP communication hook".
"""

import numbers

import torch
import torch.distributed as dist

import compressors
from allreducers.transports.torchdist import TorchDistributedTransport


class SparDLState:
    """State of :func:`spardl_hook`: the method, its options and one synchronizer per bucket layout.

    Each bucket layout gets its own synchronizer, created on first use, and a result buffer of
    its own, allocated once. A residual belongs to parameters, not to a bucket: a synchronizer
    for a new layout starts from the residuals its parameters had in the layouts they come
    from, and with their dense warm-up count. The state is this rank's: :meth:`state_dict` and
    :meth:`load_state_dict` carry the residuals through checkpoints, each rank its own.

    Args:
        process_group: the ``torch.distributed`` group (``None``: the default group).
        density: the fraction of each bucket kept, in (0, 1].
        method: any name of ``compressors.available()``.
        skip_nonfinite: for mixed precision with ``torch.amp.GradScaler``, whose overflowing
            steps are routine. If any rank's bucket holds NaN or inf (found with one extra
            one-element all-reduce per bucket), every rank gets the bucket as NaN, so the
            scaler skips the step on all of them, and the residuals are left as they were.
            Without it such a bucket is a ``ValueError`` (a diverged run).
        model: the module (or DDP model) the hook serves. With it a parameter is known by its
            name, so a saved state loads into a model with layers frozen or added: each
            residual goes back to the parameter of its name (those of parameters no longer
            trained stay unused). Without it parameters are numbered in the order the state
            first sees them, which assumes the same trainable parameters in the same order in
            every run.
        **options: go to ``compressors.create`` (e.g. ``teams=2`` for spardl,
            ``dense_warmup=512``).

    Raises:
        ValueError: an unknown method, an invalid density, or an unknown or invalid option.
    """

    def __init__(
        self,
        process_group=None,
        density: float = 0.01,
        method: str = "spardl",
        skip_nonfinite: bool = False,
        model=None,
        **options,
    ) -> None:
        self.method = compressors.resolve(method).name
        self.density = compressors.base.check_density(density)
        unknown = sorted(set(options) - set(compressors.options(self.method)))
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for {method!r}; "
                f"valid: {', '.join(compressors.options(self.method))}"
            )
        self.skip_nonfinite = bool(skip_nonfinite)
        self.parameters_by = "order" if model is None else "name"
        self.transport = TorchDistributedTransport(process_group)
        # Building one checks the options' values.
        compressors.create(self.method, self.transport, numel=1, density=density, **options)
        self.options = self._settled(self.method, options)
        self.synchronizers: dict = {}  # layout key -> synchronizer
        self._layouts: dict = {}  # layout key -> (parameter numbers, sizes, result buffer)
        # id(parameter) -> its number, in the order the state first sees them; with ``model``, its
        # name ("module." of a DDP wrapper dropped), known from the start.
        self._numbers: dict = (
            {}
            if model is None
            else {id(p): name.removeprefix("module.") for name, p in model.named_parameters()}
        )
        self._owners: dict = {}  # parameter number -> (layout key, offset, numel)
        self._pending: dict = {}  # layout key -> saved state not yet used

    @staticmethod
    def _settled(method: str, options: dict) -> dict:
        """Return every option of ``method``, defaults filled in, NumPy numbers as Python's.

        Two states of one configuration then compare equal, and the state loads with
        ``torch.load``'s defaults.
        """
        settled = dict(compressors.option_defaults(method), **options)
        return {
            key: value
            if isinstance(value, bool)
            else int(value)
            if isinstance(value, numbers.Integral)
            else float(value)
            if isinstance(value, numbers.Real)
            else value
            for key, value in settled.items()
        }

    def synchronizer(self, bucket: dist.GradBucket):
        """Return the synchronizer of ``bucket``'s layout and its reused result buffer.

        Both are created on the layout's first use.

        Raises:
            ValueError: with ``model=``, the bucket holds a parameter the model does not have;
                or a loaded residual does not fit its parameter's size.
            RuntimeError: the bucket's size differs from its parameters'.
        """
        parameters = bucket.parameters()
        numbers = [self._number(p) for p in parameters]
        key = ",".join(map(str, numbers))
        if key not in self.synchronizers:
            sizes = [p.numel() for p in parameters]
            if sum(sizes) != bucket.buffer().numel():
                raise RuntimeError(
                    f"bucket {bucket.index()}: {bucket.buffer().numel()} entries for "
                    f"parameters of {sum(sizes)}"
                )
            self._build(key, numbers, sizes, bucket.buffer().device)
        return self.synchronizers[key], self._layouts[key][2]

    def _number(self, parameter) -> int | str:
        """Return how this state knows ``parameter``.

        Its name with ``model=``, else the order in which the state first saw it.
        """
        if self.parameters_by == "order":
            return self._numbers.setdefault(id(parameter), len(self._numbers))
        if id(parameter) not in self._numbers:
            raise ValueError(
                "a DDP bucket holds a parameter that is not in the model given as "
                "SparDLState(model=...)"
            )
        return self._numbers[id(parameter)]

    def _build(self, key: str, numbers: list, sizes: list, device) -> None:
        sync = compressors.create(
            self.method, self.transport, numel=sum(sizes), density=self.density, **self.options
        )
        sync.count_nnz = False  # nothing reads the count: no pass over the bucket for it
        saved = self._pending.pop(key, None)
        if saved is not None:
            sync.load_state_dict(saved["state"])
        # The dense warm-up count carries over from every layout these parameters come from.
        sync.calls = max(
            [sync.calls]
            + [
                self.synchronizers[owner].calls
                for owner in {self._owners[n][0] for n in numbers if n in self._owners}
            ]
            + [
                int(other["state"]["calls"])
                for other in self._pending.values()
                if not set(numbers).isdisjoint(other["numbers"])
            ]
        )
        residual = sync.residual
        offset = 0
        for number, size in zip(numbers, sizes):
            slot = self._slot(number)
            if slot is not None and slot.numel() != size:
                raise ValueError(
                    f"the loaded hook state holds {slot.numel()} residual entries for "
                    f"parameter #{number}, which has {size}: it was saved for another "
                    "set of trainable parameters; start from a fresh state"
                )
            if slot is not None:  # moved, so that it counts once
                residual[offset : offset + size].copy_(slot)
                slot.zero_()
            self._owners[number] = (key, offset, size)
            offset += size
        self.synchronizers[key] = sync
        self._layouts[key] = (numbers, sizes, torch.empty(sum(sizes), device=device))
        owning = {owner for owner, _, _ in self._owners.values()}
        for stale in [k for k in self.synchronizers if k not in owning]:  # replaced layouts
            del self.synchronizers[stale], self._layouts[stale]

    def _slot(self, number: int):
        """Return where parameter ``number``'s residual lives now, as a view; None if nowhere.

        Its current bucket, else a saved bucket not built yet.
        """
        if number in self._owners:
            key, offset, size = self._owners[number]
            return self.synchronizers[key].residual[offset : offset + size]
        for saved in self._pending.values():
            if number in saved["numbers"]:
                at = saved["numbers"].index(number)
                offset = sum(saved["sizes"][:at])
                return saved["state"]["residual"][offset : offset + saved["sizes"][at]]
        return None

    def residual(self, parameter: torch.Tensor) -> torch.Tensor:
        """Return this rank's residual of ``parameter``, shaped like it.

        Zeros while the state holds none for it: before its first backward pass under this
        state, which is when the state learns its buckets, unless a loaded state of a state
        with ``model=`` holds it.
        """
        slot = self._slot(self._numbers[id(parameter)]) if id(parameter) in self._numbers else None
        return torch.zeros_like(parameter) if slot is None else slot.view_as(parameter)

    def state_dict(self) -> dict:
        """Return this rank's synchronizers' states (residuals, thresholds...) by bucket layout."""
        buckets = dict(self._pending)
        for key, sync in self.synchronizers.items():
            numbers, sizes, _ = self._layouts[key]
            buckets[key] = {"numbers": numbers, "sizes": sizes, "state": sync.state_dict()}
        return {
            "method": self.method,
            "density": self.density,
            "options": dict(self.options),
            "rank": self.transport.rank,
            "size": self.transport.size,
            "parameters_by": self.parameters_by,
            "buckets": buckets,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` of this rank.

        The buckets pick their residuals up when DDP next builds them, and whatever this state
        held before is dropped (so a state in use rolls back to the saved one, whichever bucket
        layout is live).

        Raises:
            ValueError: the state is of another method, density, options, rank or world size,
                or was saved with ``model=`` and is loaded without it (or the other way round).
        """
        mine = {
            "method": self.method,
            "density": self.density,
            "options": dict(self.options),
            "rank": self.transport.rank,
            "size": self.transport.size,
            "parameters_by": self.parameters_by,
        }
        state = dict(state, parameters_by=state.get("parameters_by", "order"))  # older states
        if state.get("method") in compressors.available() and isinstance(
            state.get("options"), dict
        ):
            state = dict(state, options=self._settled(state["method"], state["options"]))
        differ = [
            f"{key} {state.get(key)!r} (this state: {value!r})"
            for key, value in mine.items()
            if state.get(key) != value
        ]
        if differ:
            raise ValueError("the saved hook state does not fit this one: " + "; ".join(differ))
        self._pending = {
            key: {
                "numbers": list(saved["numbers"]),
                "sizes": list(saved["sizes"]),
                "state": dict(saved["state"], residual=saved["state"]["residual"].clone()),
            }
            for key, saved in state["buckets"].items()
        }
        self.synchronizers.clear()
        self._layouts.clear()
        self._owners.clear()


def spardl_hook(state: SparDLState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over the group with ``state``'s method.

    The bucket is averaged synchronously, into the layout's result buffer (DDP copies it into
    the gradients before the next backward pass), and handed back as a completed future.
    Buckets of another dtype (float16, bfloat16, float64) are synchronized in float32, the dtype
    of the residuals and messages, and the average is cast back: float64 gradients thus carry
    float32 precision (about 1e-7 relative).

    Raises:
        ValueError: a bucket of sparse gradients, or (without ``skip_nonfinite``) one holding
            NaN or inf.
    """
    flat = bucket.buffer()
    if flat.is_sparse:
        raise ValueError(
            "spardl_hook: a bucket of sparse gradients (nn.Embedding(sparse=True)?) "
            "cannot be synchronized; use dense gradients or DDP's default all-reduce"
        )
    sync, out = state.synchronizer(bucket)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if state.skip_nonfinite:
        # One pass, no n-sized mask: the sum is NaN or inf when an entry is, and otherwise only
        # for values near float32's limit, which the float32 synchronization would overflow too.
        flag = (~torch.isfinite(flat.sum(dtype=torch.float32))).float().reshape(1)
        if state.transport.allreduce_sum_(flag).item() > 0:
            future.set_result(torch.full_like(flat, float("nan")))
            return future
    averaged = sync.allreduce(flat if flat.dtype == torch.float32 else flat.float(), out=out)
    future.set_result(averaged.to(flat.dtype))
    return future
