"""Run under ``torchrun --nproc-per-node 1`` on a CUDA machine: the hook with NCCL on the GPU.

For every method, training with the overlapped hook (buckets averaged on the communication
thread, on the pipeline's side stream, which waits for backward's stream) gives the bits of the
hook run blocking, and at density 1 the parameters of plain DDP.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors
from compressors.ddp import SparDLState, spardl_hook
from compressors.pipeline import BucketPipeline

dist.init_process_group("nccl")
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
torch.cuda.set_device(device)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(device)


streams = []  # the current stream of every overlapped bucket's work
_average = BucketPipeline._average


def _spy(self, *args):
    streams.append(torch.cuda.current_stream(device))
    return _average(self, *args)


BucketPipeline._average = _spy


def blocking_hook(state, bucket):
    sync, out = state.synchronizer(bucket)
    future = torch.futures.Future()
    future.set_result(sync.allreduce(bucket.buffer(), out=out))
    return future


def train(method, hook, density=0.05, steps=5):
    ddp = DistributedDataParallel(model(), device_ids=[device], bucket_cap_mb=1)
    if hook is not None:
        ddp.register_comm_hook(SparDLState(density=density, method=method, model=ddp), hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator(device=device).manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(64, 64, device=device, generator=generator)
        y = torch.randint(0, 10, (64,), device=device, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


plain = train("dense", None)
for method in compressors.available():
    streams.clear()
    overlapped = train(method, spardl_hook)
    assert streams and torch.cuda.default_stream(device) not in streams, f"{method}: streams"
    assert torch.equal(overlapped, train(method, blocking_hook)), f"{method}: not the same bits"
    dense = train(method, spardl_hook, density=1.0)
    assert torch.allclose(dense, plain, atol=1e-4), f"{method} at density 1 differs from DDP"
    print(f"{method}: overlapped = blocking on {device}", flush=True)
print(f"ddp gpu checks passed on {dist.get_world_size()} rank(s)")
dist.destroy_process_group()
sys.stdout.flush()
