"""Run under ``torchrun --nproc-per-node 1`` on a CUDA machine: the hook with NCCL on the GPU.

For every method, training with the overlapped hook (buckets averaged on the communication
thread, which waits for backward's stream) gives the bits of the hook run blocking, and at
density 1 the parameters of plain DDP.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors
from compressors.ddp import SparDLState, spardl_hook

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
    overlapped = train(method, spardl_hook)
    assert torch.equal(overlapped, train(method, blocking_hook)), f"{method}: not the same bits"
    dense = train(method, spardl_hook, density=1.0)
    assert torch.allclose(dense, plain, atol=1e-4), f"{method} at density 1 differs from DDP"
    print(f"{method}: overlapped = blocking on {device}", flush=True)
print(f"ddp gpu checks passed on {dist.get_world_size()} rank(s)")
dist.destroy_process_group()
sys.stdout.flush()
