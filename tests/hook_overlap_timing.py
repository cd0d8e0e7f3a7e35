"""Time a training step with the hook blocking and overlapped (docs/DDP_HOOK.md).

``torchrun --standalone --nproc-per-node 2 tests/hook_overlap_timing.py``: an MLP of about 9.5 M
parameters in 25 MB buckets, batch 64; rank 0 prints the median step time of plain DDP, of the
hook run blocking (each bucket averaged inside the hook, as before the pipeline) and of the
overlapped hook, for spardl at density 0.01.
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from compressors.ddp import SparDLState, spardl_hook

dist.init_process_group("gloo")
rank = dist.get_rank()
STEPS = int(os.environ.get("STEPS", "15"))


def blocking_hook(state, bucket):
    sync, out = state.synchronizer(bucket)
    future = torch.futures.Future()
    future.set_result(sync.allreduce(bucket.buffer(), out=out))
    return future


def step_times(hook):
    torch.manual_seed(0)
    widths = [512, 2048, 2048, 1024, 1024, 512, 10]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    ddp = DistributedDataParallel(torch.nn.Sequential(*layers[:-1]), bucket_cap_mb=25)
    if hook is not None:
        ddp.register_comm_hook(SparDLState(density=0.01, method="spardl", model=ddp), hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    times = []
    for _ in range(STEPS):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


for name, hook in (
    ("plain DDP", None),
    ("hook, blocking", blocking_hook),
    ("hook, overlapped", spardl_hook),
):
    seconds = step_times(hook)
    if rank == 0:
        print(f"{name:18s} median step {1000 * seconds:7.1f} ms", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
