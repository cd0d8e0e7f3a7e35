"""Run under ``mpiexec -n P``: SparDL and dense invariants on the real MPI transport.

Every rank derives every rank's gradients from the seed, so it can check the exact dense
average itself. Any failed check raises, which aborts the whole job with a non-zero status.
"""

import math

import numpy as np
import torch
from mpi4py import MPI

import compressors
from allreducers.transports.lifecycle import abort_on_uncaught_exception

abort_on_uncaught_exception()
torch.set_num_threads(1)
world = MPI.COMM_WORLD
rank, workers = world.Get_rank(), world.Get_size()


def gradients(call, numel):
    rng = np.random.default_rng(1000 * call + numel)
    return torch.from_numpy(rng.standard_t(3, (workers, numel)).astype(np.float32))


def check(method, numel, density, calls=3, **options):
    """Same bits on every rank and mass conserved over ``calls`` calls; returns every call's
    result and residual (to compare executions that must agree)."""
    sync = compressors.create(method, world, numel=numel, density=density, **options)
    history = []
    for call in range(calls):
        grads = gradients(call, numel)
        before = sync.residual.clone()
        result = sync.allreduce(grads[rank].clone())
        everyone = world.allgather(result.numpy().tobytes())
        assert all(blob == everyone[0] for blob in everyone), f"{method}: ranks disagree"
        lhs = world.allreduce((grads[rank].double() + before.double()).numpy(), op=MPI.SUM)
        rhs = workers * result.double().numpy() + world.allreduce(
            sync.residual.double().numpy(), op=MPI.SUM
        )
        assert np.abs(lhs - rhs).max() <= 1e-5 * (np.abs(lhs).max() + 1), f"{method}: mass lost"
        if density == 1.0 or method == "dense":
            expected = grads.double().mean(0).numpy()  # at density 1 the residual stays zero
            assert np.allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5), (
                f"{method}: not dense"
            )
        if method == "spardl" and options.get("teams", 1) == 1:
            block = math.ceil(numel / workers)
            budget = max(1, int(block * density))
            assert sync.stats["bytes_sent"] == 16 * (workers - 1) * budget, sync.stats
            srs_rounds = (
                workers - 1 if options.get("srs") == "blocks" else math.ceil(math.log2(workers))
            )
            assert sync.stats["rounds"] == srs_rounds + math.ceil(math.log2(workers)), sync.stats
        history.append((result, sync.residual.clone()))
    return history


def same_bits(first, second):
    return all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(first, second))


check("dense", 1003, 1.0)
strided = torch.zeros(2 * 1003)[::2]  # MPI reduces contiguous buffers only: the method stages it
assert (
    compressors.create("dense", world, numel=1003, density=1.0).allreduce(
        gradients(0, 1003)[rank], out=strided
    )
    is strided
)
assert np.allclose(
    strided.numpy(), gradients(0, 1003).double().mean(0).numpy(), rtol=1e-5, atol=1e-5
), "strided out"
powers = [d for d in range(2, workers + 1) if workers % d == 0 and not d & (d - 1)]
for numel in (workers - 1 or 1, 1003, 20011):
    for density in (0.01, 0.2, 1.0):
        rounds = check("spardl", numel, density)
        if numel == 1003:  # srs="blocks" must give the bits of "rounds"
            assert same_bits(rounds, check("spardl", numel, density, srs="blocks")), (
                "srs blocks differ"
            )
        for teams in [d for d in range(2, workers + 1) if workers % d == 0 and d < workers][:2]:
            check("spardl", numel, density, teams=teams, sag="bruck")
        for teams in powers:  # R-SAG for every power-of-two d, d = P included
            rounds = check("spardl", numel, density, teams=teams, sag="recursive")
            if numel == 1003 and teams == powers[0]:
                blocks = check("spardl", numel, density, teams=teams, sag="recursive", srs="blocks")
                assert same_bits(rounds, blocks), "srs blocks differ from rounds under R-SAG"
world.Barrier()
if rank == 0:
    print(f"mpi core checks passed on {workers} ranks")
