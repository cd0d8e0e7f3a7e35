"""Run under ``mpiexec -n P``: GradientBuckets (the trainer's front-end of the pipeline) on MPI.

``python tests/buckets_mpi_check.py [check|interrupt]``: ``check`` compares, for every method,
the overlapped buckets with blocking calls on the same gradients, bit for bit, and the ranks'
parameters after training; ``interrupt`` trains until Ctrl-C, rank 0 printing ``started``.
"""

import sys

import torch
from mpi4py import MPI

import compressors
from allreducers.transports.lifecycle import abort_on_uncaught_exception
from compressors.buckets import GradientBuckets
from compressors.pipeline import BucketPipeline

abort_on_uncaught_exception()
world = MPI.COMM_WORLD
rank, workers = world.Get_rank(), world.Get_size()
torch.set_num_threads(1)
mode = sys.argv[1] if len(sys.argv) > 1 else "check"


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
        torch.nn.Linear(256, 10),
    )


def backward(net, step):
    generator = torch.Generator().manual_seed(100 * step + rank)
    x, y = (
        torch.randn(16, 32, generator=generator),
        torch.randint(0, 10, (16,), generator=generator),
    )
    torch.nn.functional.cross_entropy(net(x), y).backward()


def check(method):
    net, reference = model(), model()
    buckets = GradientBuckets(net, BucketPipeline(world, method, 0.05), bucket_mb=0.2)
    assert len(buckets.buckets) >= 3, buckets.buckets
    blocking = BucketPipeline(world, method, 0.05)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    named = dict(reference.named_parameters())
    for step in range(4):
        optimizer.zero_grad()
        reference.load_state_dict(net.state_dict())
        reference.zero_grad()
        backward(net, step)
        backward(reference, step)
        buckets.finish()
        for index, names in enumerate(buckets.buckets):
            flat = torch.cat([named[name].grad.reshape(-1) for name in names])
            want = blocking.synchronize(names, [named[n].numel() for n in names], flat, index)
            got = torch.cat([dict(net.named_parameters())[n].grad.reshape(-1) for n in names])
            assert torch.equal(got, want), f"{method}: bucket {index} differs from blocking"
        stats = buckets.pipeline.take_stats()
        assert len(stats["buckets"]) == len(buckets.buckets), stats
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().tobytes()
    assert all(blob == flat for blob in world.allgather(flat)), f"{method}: ranks differ"


if mode == "check":
    for method in compressors.available():
        check(method)
    world.Barrier()
    if rank == 0:
        print(f"gradient buckets checks passed on {workers} ranks")
else:
    net = model()
    buckets = GradientBuckets(net, BucketPipeline(world, "spardl", 0.05), bucket_mb=0.2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    step = 0
    while True:
        optimizer.zero_grad()
        backward(net, step)
        buckets.finish()
        optimizer.step()
        if step == 0 and rank == 0:
            print("started", flush=True)
        step += 1
