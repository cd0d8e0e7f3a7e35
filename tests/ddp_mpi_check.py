"""Run under ``mpiexec -n P``: the DDP hook synchronizing over MPI, overlapped with backward.

``python tests/ddp_mpi_check.py [check|interrupt|diverge|kill]``:

* ``check``: for every registered method, training with the overlapped hook gives the bits of
  the same hook run blocking (each bucket averaged inside the hook), the same parameters on
  every rank, and per-bucket traffic that sums to the step's.
* ``interrupt`` and ``kill``: train until stopped, rank 0 printing ``started`` and every rank's
  process id after the first step (the test sends Ctrl-C or kills a rank).
* ``diverge``: rank 1's gradient turns NaN at step 3.

DDP itself needs ``torch.distributed`` (Gloo) for its start-up broadcast; the hook's traffic
goes over MPI.
"""

import os
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import compressors
from compressors.ddp import SparDLState, spardl_hook

world = MPI.COMM_WORLD
rank, workers = world.Get_rank(), world.Get_size()
torch.set_num_threads(1)
mode = sys.argv[1] if len(sys.argv) > 1 else "check"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
if rank == 0:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
else:
    port = None
os.environ["MASTER_PORT"] = str(world.bcast(port))
dist.init_process_group("gloo", rank=rank, world_size=workers)
pids = world.allgather(os.getpid())


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 300),
        torch.nn.Linear(300, 10),
    )


def batches(steps):
    generator = torch.Generator().manual_seed(rank)
    for step in range(steps):
        inputs = torch.randn(8, 20, generator=generator)
        if mode == "diverge" and rank == 1 and step == 3:
            inputs[0, 0] = float("nan")
        yield inputs, torch.randint(0, 10, (8,), generator=generator)


def blocking_hook(state, bucket):
    """The hook as it was: the bucket averaged inside the hook, a completed future."""
    sync, out = state.synchronizer(bucket)
    future = torch.futures.Future()
    future.set_result(sync.allreduce(bucket.buffer(), out=out))
    return future


def train(method, hook, steps=4, traffic=None):
    ddp = DistributedDataParallel(model(), bucket_cap_mb=0.25)
    state = SparDLState(world, density=0.05, method=method, model=ddp)
    ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step, (inputs, targets) in enumerate(batches(steps)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
        stats = state.take_stats()
        if traffic is not None:
            traffic.append(stats)
        if step == 0 and rank == 0 and mode in ("interrupt", "kill"):
            print("started", *pids, flush=True)
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]), state


if mode == "check":
    for method in compressors.available():
        traffic = []
        overlapped, state = train(method, spardl_hook, traffic=traffic)
        reference, _ = train(method, blocking_hook)
        assert torch.equal(overlapped, reference), f"{method}: overlapped differs from blocking"
        everyone = world.allgather(overlapped.numpy().tobytes())
        assert all(blob == everyone[0] for blob in everyone), f"{method}: ranks differ"
        assert len(state.synchronizers) >= 2, f"{method}: {list(state.synchronizers)}"
        for stats in traffic[1:]:  # the first step runs before DDP rebuilds its buckets
            assert len(stats["buckets"]) == len(state.synchronizers), stats
            assert stats["bytes_sent"] == sum(b["bytes_sent"] for b in stats["buckets"]) > 0
        # A checkpoint of the overlapped state loads into a fresh one.
        SparDLState(world, density=0.05, method=method, model=model()).load_state_dict(
            state.state_dict()
        )
    world.Barrier()
    if rank == 0:
        print(f"ddp mpi checks passed on {workers} ranks")
else:
    train("spardl", spardl_hook, steps=10**9 if mode != "diverge" else 10)
dist.destroy_process_group()
