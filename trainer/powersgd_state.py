"""PowerSGD's hook state (``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``) as a
checkpoint holds it, and mapped to another number of ranks.

``PowerSGDState`` pickles (without its process group), but a pickled object is what the
trainer's safe load refuses: :func:`state_dict` keeps only tensors and plain values. What it
carries: the iteration count (dense until ``start_iter``), each bucket's error feedback
(``error_dict``, this rank's), the warm-start matrices P and Q (``p_memory_dict`` and
``q_memory_dict``, the same on every rank once all-reduced) and the generator that draws Q's
initial values in the same order on every rank.

Each bucket's buffers are laid out in the order of the bucket's parameters, which DDP sets anew
when it rebuilds its buckets after the first iteration of every run: :class:`Layouts` records
the order at each call, a checkpoint keeps it, and a resumed run's first call of each bucket
puts the saved buffers into the order of that call (:func:`remap`), so that every parameter
gets its own error and matrices back.

PowerSGD's result is the all-reduced approximation of gradient + error, and each rank keeps
what its own gradient + error lost to it: as for the sparse methods, the pending update is the
average of the ranks' errors. :func:`reshard` keeps it as ``compressors.reshard`` does (each
entry held by one new rank, scaled by the new world size over the old); P, Q, the count and
the generator are every rank's alike and carry over from rank 0.
"""

from __future__ import annotations

import math

import torch

from trainer.checkpoint import numpy_state, numpy_state_tuple

_BUFFERS = ("error_dict", "p_memory_dict", "q_memory_dict")
_COUNTERS = ("iter", "total_numel_before_compression", "total_numel_after_compression")


class Layouts:
    """The parameter order of each bucket, and saved buffers waiting for their bucket's call.

    Args:
        parameters: the trainable parameters; a parameter is known by its position here.
    """

    def __init__(self, parameters) -> None:
        self.numbers = {id(p): number for number, p in enumerate(parameters)}
        self.shapes = [tuple(p.shape) for p in parameters]
        self.orders: dict = {}  # bucket index -> parameter numbers, as at its latest call
        self.pending: dict = {}  # bucket index -> (saved order, error, P, Q) to install

    def wrap(self, hook):
        """Return ``hook`` (PowerSGD's) preceded by recording the bucket's order and, at a
        resumed run's first call of a bucket, installing its saved buffers in that order."""

        def ordered(state, bucket):
            index, device = bucket.index(), bucket.buffer().device
            order = [self.numbers[id(p)] for p in bucket.parameters()]
            saved = self.pending.pop(index, None)
            if saved is not None:  # a resumed run's first call of this bucket
                before, *buffers = saved
                self.orders[index] = before
                for name, tensor in zip(_BUFFERS, buffers):
                    if tensor is not None:
                        getattr(state, name)[index] = tensor.to(device)
            before = self.orders.get(index)
            if before is not None and before != order:  # DDP rebuilt its buckets
                self._reorder(state, index, before, order)
            self.orders[index] = order
            return hook(state, bucket)

        return ordered

    def _reorder(self, state, index, before, order) -> None:
        """Put bucket ``index``'s buffers from parameter order ``before`` into ``order``; drop
        them where the bucket holds other parameters now (it then starts afresh)."""
        keep = sorted(before) == sorted(order)
        sizes = {n: math.prod(self.shapes[n]) for n in order}
        ps, qs = _matrix_sizes(
            self.shapes, state.matrix_approximation_rank, state.min_compression_rate
        )
        for name, per_parameter in zip(_BUFFERS, (sizes, ps, qs)):
            held = getattr(state, name)
            if index in held:
                if keep:
                    held[index] = remap(held[index], before, order, per_parameter)
                else:
                    del held[index]


def remap(flat: torch.Tensor, before, order, sizes) -> torch.Tensor:
    """``flat``, pieces of ``sizes[n]`` entries for the numbers ``before``, in ``order``."""
    pieces = dict(zip(before, torch.split(flat, [sizes.get(n, 0) for n in before])))
    return torch.cat([pieces[n] for n in order]) if order else flat


def worth_compressing(rows: int, columns: int, rank: int, rate: float) -> bool:
    """Whether PowerSGD compresses a ``rows`` x ``columns`` matrix at ``rank``: its factors,
    ``(rows + columns) * rank`` entries, times ``rate`` (``min_compression_rate``) are fewer than
    its entries. The rule of torch's hook (tests/test_powersgd_state.py compares the two)."""
    return (rows + columns) * rank * rate < rows * columns


def _matrix_sizes(shapes, rank, rate) -> tuple:
    """Per parameter number, the entries of its P and of its Q in PowerSGD's memory (0 for a
    tensor PowerSGD does not compress), as the hook decides it."""
    ps, qs = {}, {}
    for number, shape in enumerate(shapes):
        n = shape[0] if shape else 1
        m = math.prod(shape) // n if n else 0
        r = min(n, m, rank)
        compressed = worth_compressing(n, m, r, rate)
        ps[number], qs[number] = (n * r, m * r) if compressed else (0, 0)
    return ps, qs


def state_dict(state, layouts: Layouts) -> dict:
    """Return ``state`` (a ``PowerSGDState``) as tensors and plain values, on the CPU, with
    each bucket's parameter order (``layouts``)."""
    return {
        "orders": {int(index): list(order) for index, order in layouts.orders.items()},
        **{name: int(getattr(state, name)) for name in _COUNTERS},
        "next_stats_report": int(state.next_stats_report),
        "rank": int(state.matrix_approximation_rank),
        "rng": numpy_state(state.rng.get_state()),
        **{
            name: {int(k): v.detach().cpu().clone() for k, v in getattr(state, name).items()}
            for name in ("error_dict", "p_memory_dict", "q_memory_dict")
        },
    }


def load_state_dict(state, saved: dict, layouts: Layouts) -> None:
    """Restore :func:`state_dict` into ``state``; each bucket's buffers wait in ``layouts``
    for the bucket's first call, which puts them into its order.

    Raises:
        ValueError: saved with another matrix approximation rank.
    """
    if int(saved["rank"]) != state.matrix_approximation_rank:
        raise ValueError(
            f"PowerSGD's state of rank {saved['rank']} (here {state.matrix_approximation_rank})"
        )
    for name in _COUNTERS:
        setattr(state, name, int(saved[name]))
    state.next_stats_report = int(saved["next_stats_report"])
    state.rng.set_state(numpy_state_tuple(saved["rng"]))
    state.error_dict, state.p_memory_dict, state.q_memory_dict = {}, {}, {}
    layouts.pending = {
        int(index): (
            list(order),
            saved["error_dict"].get(index),
            saved["p_memory_dict"].get(index),
            saved["q_memory_dict"].get(index),
        )
        for index, order in saved.get("orders", {}).items()
    }


def reshard(states: list, size: int) -> list:
    """Return :func:`state_dict`s of ``size`` ranks for the P ranks' ``states`` (see module)."""
    workers = len(states)
    errors = {}
    for bucket in states[0]["error_dict"]:
        total = sum(state["error_dict"][bucket].double() for state in states) * (size / workers)
        errors[bucket] = total
    resharded = []
    for rank in range(size):
        mine = {}
        for bucket, total in errors.items():
            flat, numel = total.reshape(-1), total.numel()
            start, end = numel * rank // size, numel * (rank + 1) // size
            part = torch.zeros(numel, dtype=states[0]["error_dict"][bucket].dtype)
            part[start:end] = flat[start:end].to(part.dtype)
            mine[bucket] = part.view_as(total)
        resharded.append(dict(states[0], error_dict=mine))
    return resharded
