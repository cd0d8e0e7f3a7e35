"""How much ``dense`` costs over a bare ``MPI.Allreduce`` of the same buffer, from one interleaved run.

    OMP_NUM_THREADS=1 .venv/bin/mpiexec -n 8 .venv/bin/python scripts/dense_overhead.py --numel 14728266

Each repetition times, on every rank after a barrier, a bare in-place ``Allreduce`` (sum) of a
float32 buffer of ``--numel`` entries (its input copied in untimed), a bare out-of-place
``Allreduce`` from the gradient into a buffer of its own (what an average that leaves the
gradient alone needs at least), then ``dense``'s ``allreduce(grad, out=out)`` of the same length
(as training calls it). A repetition's time is the slowest rank's. Rank 0 prints the medians and
dense's ratio to each; the first ``--warmup`` repetitions are left out. Nothing is asserted: the
ratios are measurements.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import compressors
from comm.mpi import MPITransport


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def timed(comm, work) -> float:
    """Seconds ``work()`` took on the slowest rank, every rank starting after a barrier."""
    comm.Barrier()
    start = time.perf_counter()
    work()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=positive, default=14_728_266, help="entries of the gradient")
    parser.add_argument("--repeats", type=positive, default=20, help="timed repetitions of each")
    parser.add_argument("--warmup", type=int, default=2, help="repetitions left out first")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.Get_rank())
    grad = torch.randn(args.numel)
    bare, apart, out = torch.empty(args.numel), torch.empty(args.numel), torch.empty(args.numel)
    sync = compressors.create("dense", MPITransport(comm), numel=args.numel)
    times = {"bare": [], "apart": [], "dense": []}
    for repeat in range(args.warmup + args.repeats):
        bare.copy_(grad)  # untimed: the bare call sums its buffer in place
        measured = {"bare": timed(comm, lambda: comm.Allreduce(MPI.IN_PLACE, bare.numpy(), op=MPI.SUM)),
                    "apart": timed(comm, lambda: comm.Allreduce(grad.numpy(), apart.numpy(), op=MPI.SUM)),
                    "dense": timed(comm, lambda: sync.allreduce(grad, out=out))}
        if repeat >= args.warmup:
            for name, seconds in measured.items():
                times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    if comm.Get_rank() == 0:
        print(f"P = {comm.Get_size()}, n = {args.numel}: bare Allreduce in place {1e3 * medians['bare']:.1f} ms, "
              f"out of place {1e3 * medians['apart']:.1f} ms, dense {1e3 * medians['dense']:.1f} ms; dense / in place "
              f"{medians['dense'] / medians['bare']:.3f}, dense / out of place {medians['dense'] / medians['apart']:.3f}")
    return medians


if __name__ == "__main__":
    main()
