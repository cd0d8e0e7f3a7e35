"""How much ``dense`` costs over a bare ``MPI.Allreduce`` of the same buffer, in one run.

The two are timed interleaved.

    .venv/bin/mpiexec -n 8 .venv/bin/python scripts/dense_overhead.py --numel 14728266

Each repetition times, on every rank after a barrier, a bare in-place ``Allreduce`` (sum) of a
float32 buffer of ``--numel`` entries (its input copied in untimed), a bare out-of-place
``Allreduce`` from the gradient into a buffer of its own (what an average that leaves the
gradient alone needs at least), ``dense``'s ``allreduce(grad, out=out)`` of the same length, as
the trainer and the benchmark call it (no non-zero count: ``count_nnz`` off), and ``dense`` in
place, ``allreduce(buffer, out=buffer)`` (its input copied in untimed). A repetition's time is the
slowest rank's. Rank 0 prints the medians, dense's ratio to the out-of-place call and dense in
place's to the in-place one; the first ``--warmup`` repetitions are left out. Nothing is
asserted: the ratios are measurements.
"""

from __future__ import annotations

import statistics
import time

import torch

import compressors

from .cli import RankZeroParser

__all__ = ["slowest_seconds", "main"]


def slowest_seconds(comm, work) -> float:
    """Seconds ``work()`` took on the slowest rank, every rank starting after a barrier."""
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    work()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main(argv=None) -> dict:
    """Measure under mpiexec.

    Print on rank 0 and return the median seconds of ``bare`` (in place), ``apart`` (out of place),
    ``dense`` and ``dense_in_place``.
    """
    parser = RankZeroParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=14_728_266, help="entries of the gradient")
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions of each")
    parser.add_argument("--warmup", type=int, default=2, help="repetitions left out first")
    args = parser.parse_args(argv)
    if args.numel < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--numel and --repeats must be >= 1 and --warmup >= 0")
    from mpi4py import MPI

    from allreducers.transports.mpi import MPITransport

    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.Get_rank())
    grad = torch.randn(args.numel)
    bare, apart, out, own = (torch.empty(args.numel) for _ in range(4))
    sync = compressors.create("dense", MPITransport(comm), numel=args.numel)
    sync.count_nnz = False
    times = {"bare": [], "apart": [], "dense": [], "dense_in_place": []}
    for repeat in range(args.warmup + args.repeats):
        bare.copy_(grad)  # untimed: the in-place calls sum their buffers
        own.copy_(grad)
        measured = {
            "bare": slowest_seconds(
                comm, lambda: comm.Allreduce(MPI.IN_PLACE, bare.numpy(), op=MPI.SUM)
            ),
            "apart": slowest_seconds(
                comm, lambda: comm.Allreduce(grad.numpy(), apart.numpy(), op=MPI.SUM)
            ),
            "dense": slowest_seconds(comm, lambda: sync.allreduce(grad, out=out)),
            "dense_in_place": slowest_seconds(comm, lambda: sync.allreduce(own, out=own)),
        }
        if repeat >= args.warmup:
            for name, seconds in measured.items():
                times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    if comm.Get_rank() == 0:
        ms = {name: f"{1e3 * seconds:.1f} ms" for name, seconds in medians.items()}
        print(
            f"P = {comm.Get_size()}, n = {args.numel}: bare Allreduce out of place "
            f"{ms['apart']}, dense {ms['dense']} ({medians['dense'] / medians['apart']:.3f}x); "
            f"bare Allreduce in place {ms['bare']}, dense in place {ms['dense_in_place']} "
            f"({medians['dense_in_place'] / medians['bare']:.3f}x)"
        )
    return medians


if __name__ == "__main__":
    main()
