"""Torch operations one synchronization call dispatches, and how many read data-dependent sizes.

On a GPU every dispatched operation is at least one kernel launch or a trip through the
dispatcher, and an operation whose output size depends on the data (``item``, ``nonzero``,
``unique``, boolean-mask indexing) waits for the device. :func:`count_call` counts both for one
call on this thread with a ``TorchDispatchMode``; ``scripts/bench_allreduce.py --count-ops``
puts the counts of rank 0's second call into its rows, and a test checks that SparDL's count
grows with its rounds, not with P (docs/PERFORMANCE.md, "Operations per call").
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = [
    "DATA_DEPENDENT",
    "OperationCounter",
    "count_call",
    "host_syncs",
    "count_method",
    "count_table",
    "main",
]

#: ATen operations whose output's size (or a host value) comes from the data: a host sync on a GPU.
DATA_DEPENDENT = frozenset(
    {
        "_local_scalar_dense",  # item(), int(t), float(t), tolist() element reads
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "repeat_interleave",  # but not when told its output's size (``output_size``)
    }
)


class _Dispatched(TorchDispatchMode):
    """Counts this thread's ATen operations by name, boolean masks, and the bytes allocated.

    The bytes: of the storages the operations return that no input of theirs has.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.views = 0  # operations that only make a view (no work on the data)
        self.masked = 0
        self.sized = 0  # repeat_interleave calls told their output's size
        self.allocated = 0  # bytes of outputs that share no storage with an input

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        self.counts[name] += 1
        self.views += func.is_view
        if name == "repeat_interleave" and (kwargs or {}).get("output_size") is not None:
            self.sized += 1  # its output's size is given: no read of the data
        if name in ("index", "index_put_", "index_put") and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool
            for index in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())
        ):
            self.masked += 1
        out = func(*args, **(kwargs or {}))
        self.allocated += _new_bytes(out, (args, kwargs))
        return out


def _new_bytes(out, inputs) -> int:
    """Return the bytes of the storages in ``out`` that none of the tensors ``inputs`` has."""
    given = {
        leaf.untyped_storage().data_ptr()
        for leaf in tree_leaves(inputs)
        if isinstance(leaf, torch.Tensor)
    }
    made = {
        leaf.untyped_storage().data_ptr(): leaf.untyped_storage().nbytes()
        for leaf in tree_leaves(out)
        if isinstance(leaf, torch.Tensor)
    }
    return sum(size for pointer, size in made.items() if pointer not in given)


class _ListReads(TorchFunctionMode):
    """Counts ``Tensor.tolist`` calls, which dispatch no ATen operation on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            self.count += 1
        return func(*args, **(kwargs or {}))


class OperationCounter:
    """Counts the torch operations run on this thread while the ``with`` block runs.

    ``total``: the ATen operations dispatched (views and slices included, as the dispatcher
    sees them); ``working``: those that are not views. ``data_dependent``: those whose result's
    size or value reaches the host (:data:`DATA_DEPENDENT`, boolean-mask indexing, ``tolist``).
    """

    def __enter__(self) -> OperationCounter:
        self._reads, self._dispatched = _ListReads(), _Dispatched()
        self._reads.__enter__()
        self._dispatched.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatched.__exit__(*exc)
        self._reads.__exit__(*exc)

    @property
    def counts(self) -> collections.Counter:
        """The dispatched operations by name."""
        return self._dispatched.counts

    @property
    def total(self) -> int:
        """All operations dispatched."""
        return sum(self.counts.values())

    @property
    def working(self) -> int:
        """The operations that are not views: on a GPU each launches work or allocates."""
        return self.total - self._dispatched.views

    @property
    def allocated_bytes(self) -> int:
        """The bytes of the new tensors the operations made (not views, not in-place results)."""
        return self._dispatched.allocated

    @property
    def data_dependent(self) -> int:
        """The operations whose result's size or value reaches the host."""
        names = sum(self.counts[name] for name in DATA_DEPENDENT) - self._dispatched.sized
        return names + self._dispatched.masked + self._reads.count


def count_call(sync, grad: torch.Tensor, syncs: bool = True) -> dict:
    """Run ``sync.allreduce(grad)`` once: ops, working ops, data-dependent ops, bytes made.

    The keys: ``ops``, ``working_ops``, ``data_dependent_ops`` and ``allocated_bytes``.

    ``working_ops``: the operations that are not views (a view changes no data and launches no
    kernel; the dispatcher still handles it, on the host).

    ``allocated_bytes``: the bytes of the new tensors the call made, its result's included
    (docs/PERFORMANCE.md, "Memory a call makes").

    With a CUDA ``grad`` and ``syncs``, also ``host_sync_ops``: the host synchronizations of the
    call (:func:`host_syncs`). In-process ranks are threads of one process, whose sync debug mode
    and warnings they share: only one of them may count them (:func:`count_method`: rank 0).

    A collective like the call itself: every rank calls it; each counts its own thread's
    operations.
    """
    counting = grad.is_cuda and syncs
    with host_syncs() if counting else contextlib.nullcontext() as found:
        with OperationCounter() as counter:
            sync.allreduce(grad)
    counts = {
        "ops": counter.total,
        "working_ops": counter.working,
        "data_dependent_ops": counter.data_dependent,
        "allocated_bytes": counter.allocated_bytes,
    }
    if counting:
        counts["host_sync_ops"] = found["count"]
    return counts


@contextlib.contextmanager
def host_syncs():
    """Count this thread's host synchronizations that CUDA's sync debug mode reports in the block.

    Yields a dict whose ``count`` grows as they happen (``torch.cuda.set_sync_debug_mode``: a wait
    for a stream or the device, a copy to pageable memory, a read of a value). The mode is the
    process's: no other thread may use this at the same time; their synchronizations meanwhile
    are not counted, and their other warnings are shown as usual. The mode's switches are not
    counted: the first in a process reports a synchronization of its own (seen on an H200).
    """
    me, found, counting = threading.get_ident(), {"count": 0}, threading.Event()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        show = warnings.showwarning

        def tally(message, *args, **kwargs):
            if "synchroniz" not in str(message):
                show(message, *args, **kwargs)
            elif counting.is_set() and threading.get_ident() == me:
                found["count"] += 1

        warnings.showwarning = tally
        torch.cuda.set_sync_debug_mode("warn")
        counting.set()
        try:
            yield found
        finally:
            counting.clear()
            torch.cuda.set_sync_debug_mode(previous)


def count_method(transport, name: str, numel: int, density: float, gradient, **options) -> dict:
    """Create ``name`` on ``transport`` and count its second call (the first warms it up).

    ``gradient(call)`` returns this rank's gradient of a call. Collective: every rank calls it.
    """
    import compressors

    sync = compressors.create(name, transport, numel=numel, density=density, **options)
    sync.count_nnz = False
    sync.allreduce(gradient(0))
    return count_call(sync, gradient(1), syncs=transport.rank == 0)


def count_table(
    methods: list,
    workers: list,
    numel: int,
    density: float,
    seed: int = 0,
    wire: str = "fp32",
    device: str = "cpu",
) -> list:
    """Return the operations table: a row per method and group size.

    Each row ``{method, workers, numel, density, wire, device, ops, data_dependent_ops}``: rank
    0's second call of the method at ``wire`` on an in-process group of that size (seeded normal
    gradients on ``device``; on ``cuda`` also ``host_sync_ops``).
    """
    from allreducers.transports import local_group

    rows = []
    for method in methods:
        for size in workers:

            def count(transport, method=method):
                def gradient(call):
                    generator = torch.Generator().manual_seed(seed + 1000 * call + transport.rank)
                    return torch.randn(numel, generator=generator).to(device)

                return count_method(transport, method, numel, density, gradient, wire=wire)

            counts = local_group(size).run(count)[0]
            rows.append(
                {
                    "method": method,
                    "workers": size,
                    "numel": numel,
                    "density": density,
                    "wire": wire,
                    "device": device,
                    **counts,
                }
            )
    return rows


def main(argv=None) -> list:
    """``python -m syncbench.opcount``: the operations table of docs/PERFORMANCE.md."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m syncbench.opcount", description=__doc__)
    parser.add_argument("--methods", default="spardl,topk,zen,oktopk,gaussiank,topkdsa,gtopk")
    parser.add_argument("--workers", default="2,4,8,16,32", help="comma-separated P")
    parser.add_argument("--numel", type=int, default=100_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--wire", default="fp32", choices=("fp32", "fp16", "bf16"))
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="where the gradients live"
    )
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    args = parser.parse_args(argv)
    try:
        workers = [int(p) for p in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers takes comma-separated integers, got {args.workers!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available to this process")
    rows = count_table(
        args.methods.split(","),
        workers,
        args.numel,
        args.density,
        wire=args.wire,
        device=args.device,
    )
    for row in rows:
        syncs = f" syncs {row['host_sync_ops']}" if "host_sync_ops" in row else ""
        made = row["allocated_bytes"] / (4 * row["numel"])
        print(
            f"{row['method']:10} P={row['workers']:<3} {row['ops']}/{row['data_dependent_ops']}"
            f" ({row['working_ops']} not views) allocated {made:.2f}x the gradient's bytes" + syncs
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
