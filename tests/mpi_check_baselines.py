"""Run under ``mpiexec -n P``: invariants of every registered method on the real MPI transport.

Every rank derives every rank's gradients from the seed, so it can check the exact dense
average itself. Any failed check raises, which aborts the whole job with a non-zero status.
"""

import math

import numpy as np
import torch
from mpi4py import MPI

import compressors
from allreducers.transports.lifecycle import abort_on_uncaught_exception
from tests.ranks import import_extra_methods, measuring

abort_on_uncaught_exception()
import_extra_methods()
torch.set_num_threads(1)
world = MPI.COMM_WORLD
rank, workers = world.Get_rank(), world.Get_size()
log = math.ceil(math.log2(workers))
OPTIONS = {"oktopk": dict(local_interval=2, global_interval=3, region_interval=2)}


def gradients(call, numel):
    rng = np.random.default_rng(1000 * call + numel)
    return torch.from_numpy(rng.standard_t(3, (workers, numel)).astype(np.float32))


def expected_rounds(method, call):
    """Rounds of a call where the method's count is known in closed form, else ``None``."""
    if method in ("topk", "gaussiank"):
        return log
    if method in ("gtopk", "dense", "spardl"):
        return 2 * log
    if method == "topkdsa":
        return workers - 1 + 3 * log
    if method == "zen":
        return workers - 1 + log
    if method == "oktopk":
        return workers - 1 + log + (2 * log if call % 2 == 0 else 0)
    return None


def check(method, numel, density, calls=3):
    options = measuring(method, OPTIONS.get(method))
    measure = options.get("measure_loss", False)  # gTop-k: its lost mass, checked below
    sync = compressors.create(method, world, numel=numel, density=density, **options)
    k = min(numel, max(1, int(numel * density)))
    for call in range(calls):
        grads = gradients(call, numel)
        before = sync.residual.clone()
        result = sync.allreduce(grads[rank].clone())
        counted = dict(sync.stats)
        if measure:
            sync.measure_lost_mass()
            assert all(sync.stats[key] == counted[key] for key in counted), (
                "the measurement was counted"
            )
        everyone = world.allgather(result.numpy().tobytes())
        assert all(blob == everyone[0] for blob in everyone), f"{method}: ranks disagree"
        lhs = world.allreduce((grads[rank].double() + before.double()).numpy(), op=MPI.SUM)
        rhs = workers * result.double().numpy() + world.allreduce(
            sync.residual.double().numpy(), op=MPI.SUM
        )
        scale = np.abs(lhs).max() + 1
        if measure:  # what is missing is what the method says it lost
            assert abs((lhs - rhs).sum() - sync.stats["lost_sum"]) <= 1e-5 * scale * math.sqrt(
                numel
            ), method
            assert np.abs(lhs - rhs).sum() <= sync.stats["lost_mass"] + 1e-5 * scale * math.sqrt(
                numel
            ), method
        if sync.conserves_mass:
            assert np.abs(lhs - rhs).max() <= 1e-5 * scale, f"{method}: mass lost"
        if density == 1.0:
            expected = grads.double().mean(0).numpy()  # at density 1 the residual stays zero
            assert np.allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5), (
                f"{method}: not dense"
            )
        rounds = expected_rounds(method, call)
        assert rounds is None or sync.stats["rounds"] == rounds, (method, call, sync.stats)
        assert sync.stats["nnz"] == int(torch.count_nonzero(result)), method
        if method == "topk":
            assert sync.stats["bytes_sent"] == 8 * k * (workers - 1), sync.stats


def check_dense_buffers(numel):
    """dense gives the same bits into a new tensor, into ``out`` and into the gradient itself
    (MPI's out-of-place and in-place all-reduce), and counts the result's non-zeros."""
    sync = compressors.create("dense", world, numel=numel)
    grad = gradients(7, numel)[rank].clone()
    grad[::3] = 0.0  # coordinates zero on every rank stay zero
    fresh = sync.allreduce(grad)
    into = sync.allreduce(grad, out=torch.empty(numel))
    assert torch.equal(
        grad, gradients(7, numel)[rank].masked_fill(torch.arange(numel) % 3 == 0, 0.0)
    )
    in_place = sync.allreduce(grad, out=grad)
    assert in_place is grad and torch.equal(fresh, into) and torch.equal(fresh, in_place), (
        "dense buffers differ"
    )
    assert sync.stats["nnz"] == int(torch.count_nonzero(fresh)) < numel, sync.stats


def check_oktopk_in_flight(numel, calls=4):
    """Ok-Topk's exchanges in flight (MPI's matched non-blocking receives) give the bits of one
    blocking exchange per step."""
    overlapped, blocking = (
        compressors.create(
            "oktopk", world, numel=numel, density=0.02, in_flight=window, **OPTIONS["oktopk"]
        )
        for window in (4, 1)
    )
    for call in range(calls):
        grad = gradients(call + 20, numel)[rank]
        assert torch.equal(overlapped.allreduce(grad), blocking.allreduce(grad)), (
            "in flight changed the result"
        )
        assert torch.equal(overlapped.residual, blocking.residual), "in flight changed the residual"
        assert overlapped.stats["rounds"] == blocking.stats["rounds"]
        assert overlapped.stats["bytes_sent"] == blocking.stats["bytes_sent"]


for method in compressors.available():
    for numel in (workers - 1 or 1, 5003):
        for density in (0.02, 1.0):
            check(method, numel, density)
check_dense_buffers(70_001)
check_oktopk_in_flight(20_000)
world.Barrier()
if rank == 0:
    print(f"mpi baseline checks passed on {workers} ranks")
