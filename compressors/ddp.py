"""A DDP communication hook that synchronizes every gradient bucket with any registered method.

    from compressors.ddp import SparDLState, spardl_hook
    state = SparDLState(process_group=None, density=0.01, method="spardl", model=ddp_model)
    ddp_model.register_comm_hook(state, spardl_hook)

The hook returns a pending future: the buckets are averaged on a communication thread
(``compressors.pipeline``) while backward goes on. docs/DDP_HOOK.md says how to plug it into
DDP, accelerate and Lightning, how the threads share the network, what it measures, and what
error feedback means with momentum; how residuals follow their parameters when DDP rebuilds its
buckets is there and in docs/DESIGN.md, section "The DDP communication hook".
"""

import numbers

import torch
import torch.distributed as dist

import compressors
from allreducers.transports import as_transport
from allreducers.transports.torchdist import TorchDistributedTransport

from .pipeline import BucketPipeline

__all__ = ["SparDLState", "spardl_hook"]


class SparDLState:
    """State of :func:`spardl_hook`: the method, its options and one synchronizer per bucket layout.

    The buckets are averaged by a :class:`~compressors.pipeline.BucketPipeline` on a
    communication thread while backward goes on. Each bucket layout gets its own synchronizer,
    created on first use, and a result buffer of its own, allocated once. A residual belongs to
    parameters, not to a bucket (:class:`~compressors.residuals.ResidualStore`): a synchronizer
    for a new layout starts from the residuals its parameters had in the layouts they come
    from, and with their dense warm-up count. The state is this rank's: :meth:`state_dict` and
    :meth:`load_state_dict` carry the residuals through checkpoints, each rank its own.

    Args:
        process_group: the ``torch.distributed`` group (``None``: the default group), or an
            ``mpi4py`` communicator (or any transport) to synchronize over MPI instead; DDP
            itself still needs ``torch.distributed`` (Gloo) for its start-up broadcast. A
            ``torch.distributed`` group not started yet is looked up at the first backward pass
            (Lightning builds the state before it starts the group); the options' values are
            checked then.
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
        RuntimeError: an MPI communicator whose library lacks ``MPI_THREAD_SERIALIZED``.
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
        compressors.registry.check_known(self.method, options)
        self.skip_nonfinite = bool(skip_nonfinite)
        self.parameters_by = "order" if model is None else "name"
        self.options = self._settled(self.method, options)
        self._group = process_group
        self._pipeline = None
        torch_group = process_group is None or isinstance(process_group, dist.ProcessGroup)
        if not torch_group or (dist.is_available() and dist.is_initialized()):
            self._start()  # else at first use: Lightning starts the group after building this
        # id(parameter) -> its number, in the order the state first sees them; with ``model``, its
        # name ("module." of a DDP wrapper dropped), known from the start.
        self._numbers: dict = (
            {}
            if model is None
            else {id(p): name.removeprefix("module.") for name, p in model.named_parameters()}
        )

    def _start(self) -> BucketPipeline:
        """Create the transport and the pipeline, checking the options' values and MPI's threads.

        Raises:
            ValueError: an option's value is invalid for this group.
            RuntimeError: ``torch.distributed`` is not initialized, or MPI lacks
                ``MPI_THREAD_SERIALIZED``.
        """
        group = self._group
        if group is None or isinstance(group, dist.ProcessGroup):
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    "SparDLState: torch.distributed is not initialized: call "
                    "init_process_group before the first backward pass"
                )
            transport = TorchDistributedTransport(group)
        else:
            transport = as_transport(group)
        # Building one checks the options' values.
        compressors.create(self.method, transport, numel=1, density=self.density, **self.options)
        self._pipeline = BucketPipeline(
            transport, self.method, self.density, self.options, self.skip_nonfinite
        )
        return self._pipeline

    @property
    def pipeline(self) -> BucketPipeline:
        """The :class:`~compressors.pipeline.BucketPipeline` that averages the buckets."""
        return self._pipeline if self._pipeline is not None else self._start()

    @property
    def transport(self):
        """This rank's transport (created on first use if the group was not started yet)."""
        return self.pipeline.transport

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

    @property
    def synchronizers(self) -> dict:
        """The live synchronizers by bucket layout (``"3,4,5"``: its parameters' keys)."""
        self.pipeline.wait(raise_error=False)
        return self.pipeline.synchronizers()

    def keys(self, bucket: dist.GradBucket) -> list:
        """Return how this state knows each parameter of ``bucket``, in order.

        Raises:
            ValueError: with ``model=``, the bucket holds a parameter the model does not have.
        """
        return [self._number(p) for p in bucket.parameters()]

    def synchronizer(self, bucket: dist.GradBucket):
        """Return the synchronizer of ``bucket``'s layout and its reused result buffer.

        Both are created on the layout's first use. Waits until no bucket is in flight.

        Raises:
            ValueError: with ``model=``, the bucket holds a parameter the model does not have;
                or a loaded residual does not fit its parameter's size.
            RuntimeError: the bucket's size differs from its parameters'.
        """
        parameters = bucket.parameters()
        sizes = [p.numel() for p in parameters]
        if sum(sizes) != bucket.buffer().numel():
            raise RuntimeError(
                f"bucket {bucket.index()}: {bucket.buffer().numel()} entries for "
                f"parameters of {sum(sizes)}"
            )
        self.pipeline.wait(raise_error=False)
        live = self.pipeline.layout(
            self.keys(bucket), sizes, bucket.buffer().device, bucket.index()
        )
        return live.sync, live.out

    def _number(self, parameter) -> "int | str":  # quoted: DDP reads the hook's annotations
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

    def residual(self, parameter: torch.Tensor) -> torch.Tensor:
        """Return this rank's residual of ``parameter``, shaped like it.

        Zeros while the state holds none for it: before its first backward pass under this
        state, which is when the state learns its buckets, unless a loaded state of a state
        with ``model=`` holds it. Waits until no bucket is in flight.
        """
        self.pipeline.wait(raise_error=False)
        key = self._numbers.get(id(parameter))
        slot = None if key is None else self.pipeline.residual(key)
        return torch.zeros_like(parameter) if slot is None else slot.view_as(parameter)

    def take_stats(self) -> dict:
        """Return the traffic of the buckets synchronized since the last call, and reset.

        Per bucket and summed (:meth:`compressors.pipeline.BucketPipeline.take_stats`): call it
        once per step, after backward, for the step's bytes.
        """
        return self.pipeline.take_stats()

    def state_dict(self) -> dict:
        """Return this rank's synchronizers' states (residuals, thresholds...) by bucket layout."""
        self.pipeline.wait(raise_error=False)
        return {
            "method": self.method,
            "density": self.density,
            "options": dict(self.options),
            "rank": self.pipeline.rank,
            "size": self.pipeline.size,
            "parameters_by": self.parameters_by,
            "buckets": self.pipeline.state_dict(),
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
            "rank": self.pipeline.rank,
            "size": self.pipeline.size,
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
        self.pipeline.wait(raise_error=False)
        self.pipeline.load_state_dict(state["buckets"])


def spardl_hook(state: SparDLState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over the group with ``state``'s method.

    Returns at once a pending future that the state's communication thread completes, so that
    backward goes on meanwhile (DDP waits for every bucket's future before the optimizer step).
    The average lands in the layout's result buffer (DDP copies it into the gradients before the
    next backward pass). Buckets of another dtype (float16, bfloat16, float64) are synchronized
    in float32, the dtype of the residuals and messages, and the average is cast back: float64
    gradients thus carry float32 precision (about 1e-7 relative).

    Raises:
        ValueError: a bucket of sparse gradients, or (with ``model=``) a parameter the model
            does not have; errors of the synchronization itself (without ``skip_nonfinite``, a
            bucket holding NaN or inf: ``ValueError``), raised by the iteration's last bucket's
            call, once every bucket is done, so that DDP's backward raises them as they are.
    """
    flat = bucket.buffer()
    if flat.is_sparse:
        raise ValueError(
            "spardl_hook: a bucket of sparse gradients (nn.Embedding(sparse=True)?) "
            "cannot be synchronized; use dense gradients or DDP's default all-reduce"
        )
    parameters = bucket.parameters()
    sizes = [p.numel() for p in parameters]
    future = state.pipeline.submit(state.keys(bucket), sizes, flat, space=bucket.index())
    if bucket.is_last():
        # DDP waits for every future right after this call anyway, but it reads an error held
        # in one as "Unable to cast <message> to Tensor": wait here, and raise a bucket's error
        # as itself (a ValueError for NaN or inf) from backward.
        state.pipeline.wait()
    return future
