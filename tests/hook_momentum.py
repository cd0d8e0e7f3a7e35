"""Measure what error feedback does with momentum SGD under the DDP hook (docs/DDP_HOOK.md).

Run with ``torchrun --standalone --nproc-per-node 2 tests/hook_momentum.py``: a small MLP
regression, SGD (lr 0.05, momentum 0.9), dense DDP against the spardl hook at density 0.05 with
the remedies, momentum correction among them; rank 0 prints one line per variant (loss at the
start and over the last steps). ``SEED`` (default 0) seeds the data, the weights and the
batches; ``VARIANTS`` (e.g. ``0,1,10``) picks variants by their place in the list.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from compressors.ddp import SparDLState, spardl_hook

STEPS = int(os.environ.get("STEPS", "300"))
SEED = int(os.environ.get("SEED", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)


def data():
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(4096, 32, generator=generator)
    teacher = torch.randn(32, 1, generator=generator)
    targets = 3 * torch.tanh(inputs @ teacher) + inputs[:, :1] ** 2
    return inputs, targets


def run(method, lr=0.05, momentum=0.9, correction=0.0, **options):
    """``correction``: momentum correction's momentum (the hook's ``momentum`` option); SGD
    then runs without momentum."""
    torch.manual_seed(SEED)
    if correction:
        options["momentum"], momentum = correction, 0.0
    module = torch.nn.Sequential(
        torch.nn.Linear(32, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )
    ddp = DistributedDataParallel(module, bucket_cap_mb=25)
    if method != "ddp":
        ddp.register_comm_hook(
            SparDLState(density=0.05, method=method, model=ddp, skip_nonfinite=True, **options),
            spardl_hook,
        )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=momentum)
    inputs, targets = data()
    generator = torch.Generator().manual_seed(SEED * 1000 + rank)
    losses = []
    for step in range(STEPS):
        pick = torch.randint(0, len(inputs), (32,), generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(inputs[pick]), targets[pick])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if not torch.isfinite(loss) or not all(torch.isfinite(p).all() for p in ddp.parameters()):
            return losses[0], f"diverged at step {step}", ""  # NaN on every rank alike
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(ddp(inputs), targets).item()
    return losses[0], f"{sum(losses[-20:]) / 20:.4g}", f"{full:.4g}"


variants = [
    ("dense DDP", "ddp", {}),
    ("spardl", "spardl", {}),
    ("spardl, dense_warmup=50", "spardl", {"dense_warmup": 50}),
    ("spardl, dense_warmup=100", "spardl", {"dense_warmup": 100}),
    ("spardl, dense_warmup=200", "spardl", {"dense_warmup": 200}),
    ("dense DDP, lr 0.01", "ddp", {"lr": 0.01}),
    ("spardl, lr 0.01", "spardl", {"lr": 0.01}),
    ("dense DDP, momentum 0", "ddp", {"momentum": 0.0}),
    ("spardl, momentum 0", "spardl", {"momentum": 0.0}),
    ("spardl, lr 0.01, dense_warmup=50", "spardl", {"lr": 0.01, "dense_warmup": 50}),
    ("spardl, momentum correction 0.9", "spardl", {"correction": 0.9}),
    ("spardl, correction 0.9, nesterov", "spardl", {"correction": 0.9, "nesterov": True}),
    (
        "spardl, correction 0.9, density_warmup=100",
        "spardl",
        {"correction": 0.9, "density_warmup": 100},
    ),
]
if os.environ.get("VARIANTS"):
    variants = [variants[int(i)] for i in os.environ["VARIANTS"].split(",")]
for name, method, options in variants:
    first, last, full = run(method, **options)
    if rank == 0:
        print(
            f"{name:36s} first {first:8.3f}  last 20 steps {last:>22}  whole set {full:>8}",
            flush=True,
        )
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
