"""The trainer's front-end of the bucket pipeline: a module's gradients, bucket by bucket.

    pipeline = BucketPipeline(comm, "spardl", density=0.01)
    buckets = GradientBuckets(model, pipeline, bucket_mb=25)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()   # buckets start as their gradients are ready
        if not buckets.finish():                     # every .grad now holds the average
            raise SystemExit("diverged")             # on every rank alike
        optimizer.step()

Parameters are grouped into buckets of about ``bucket_mb`` MiB in the reverse order of
``model.parameters()``, the order in which backward usually produces their gradients (as DDP's
first iteration does). A hook on each parameter notes when its gradient is accumulated; when a
bucket is complete, and every bucket before it has been submitted, its gradients are copied into
the bucket's flat buffer and submitted, so that buckets go to the communication thread in the
same order on every rank whatever order backward takes. :meth:`GradientBuckets.finish` submits
what is left (a parameter without a gradient this step counts as zeros), waits, and writes each
average back into the gradients.
"""

from __future__ import annotations

import threading

import torch

from .pipeline import BucketPipeline

__all__ = ["GradientBuckets"]


class GradientBuckets:
    """Synchronizes ``model``'s gradients bucket by bucket while backward goes on.

    Args:
        model: the module whose trainable parameters are synchronized.
        pipeline: the :class:`~compressors.pipeline.BucketPipeline` that averages the buckets.
        bucket_mb: the most MiB of float32 gradient per bucket (a larger parameter is a
            bucket of its own); DDP's default is 25.

    Attributes:
        buckets: per bucket, the names of its parameters, in bucket order.
        enabled: False skips the hooks (gradient accumulation steps: synchronize only the
            last backward pass of a step).

    Raises:
        ValueError: ``bucket_mb`` is not positive, or the model has no trainable parameter.
    """

    def __init__(self, model: torch.nn.Module, pipeline: BucketPipeline, bucket_mb=25.0) -> None:
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb!r}")
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameter")
        self.pipeline = pipeline
        self.enabled = True
        cap = int(bucket_mb * 2**20) // 4
        groups, current, size = [], [], 0
        for name, parameter in reversed(named):
            if current and size + parameter.numel() > cap:
                groups.append(current)
                current, size = [], 0
            current.append((name, parameter))
            size += parameter.numel()
        groups.append(current)
        self.buckets = [[name for name, _ in group] for group in groups]
        self._parameters = [[p for _, p in group] for group in groups]
        self._sizes = [[p.numel() for p in group] for group in self._parameters]
        self._flat = [None] * len(groups)
        self._where = {id(p): index for index, group in enumerate(self._parameters) for p in group}
        self._lock = threading.Lock()
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for _, p in named]

    def _reset(self) -> None:
        self._missing = [len(group) for group in self._parameters]
        self._next = 0
        self._futures: list = []

    def _ready(self, parameter: torch.Tensor) -> None:
        if not self.enabled:
            return
        with self._lock:
            index = self._where[id(parameter)]
            self._missing[index] -= 1
            while self._next < len(self._parameters) and self._missing[self._next] == 0:
                self._submit(self._next)
                self._next += 1

    def _submit(self, index: int) -> None:
        group = self._parameters[index]
        flat = self._flat[index]
        numel = sum(self._sizes[index])
        device = next((p.grad.device for p in group if p.grad is not None), group[0].device)
        if flat is None or flat.device != device:
            flat = self._flat[index] = torch.empty(numel, device=device)
        offset = 0
        for parameter, size in zip(group, self._sizes[index]):
            piece = flat[offset : offset + size]
            if parameter.grad is None:
                piece.zero_()
            else:
                piece.copy_(parameter.grad.reshape(-1))
            offset += size
        future = self.pipeline.submit(self.buckets[index], self._sizes[index], flat, index)
        self._futures.append((index, future))

    def finish(self) -> bool:
        """Submit the buckets not submitted yet, wait, and put each average into the gradients.

        A parameter that got no gradient this step is synchronized as zeros, and its ``.grad``
        is created.

        Returns:
            Whether every average is finite: the same answer on every rank (the averages are),
            so ranks can stop together without a collective of their own. With the pipeline's
            ``skip_nonfinite``, NaN or inf on any rank makes it False everywhere.

        Raises:
            Exception: the first bucket's error (``ValueError`` for NaN or inf without
                ``skip_nonfinite``).
        """
        with self._lock:
            while self._next < len(self._parameters):
                self._submit(self._next)
                self._next += 1
            futures = self._futures
            self._reset()
        self.pipeline.wait()
        finite = True
        for index, future in futures:
            averaged = future.value()
            finite = finite and bool(torch.isfinite(averaged.sum()))
            offset = 0
            for parameter, size in zip(self._parameters[index], self._sizes[index]):
                piece = averaged[offset : offset + size].view_as(parameter)
                if parameter.grad is None:
                    parameter.grad = piece.clone()
                else:
                    parameter.grad.copy_(piece)
                offset += size
        return finite

    def remove(self) -> None:
        """Remove the hooks from the parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
