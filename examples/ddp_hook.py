"""SparDL as PyTorch DDP's communication hook, with momentum correction at the dense settings.

    torchrun --standalone --nproc-per-node 2 examples/ddp_hook.py [--dense] [--steps 300]

A small MLP learns a regression on 2 ranks with SGD at lr 0.05 and momentum 0.9. With the hook,
momentum moves into the synchronizer (DGC's momentum correction: ``momentum=0.9``), where it
acts on each entry before sparsification, and SGD runs without it. ``--dense``: DDP's own
all-reduce with SGD's momentum, to compare. Rank 0 prints the loss over the whole data set.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from compressors.ddp import SparDLState, spardl_hook

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dense", action="store_true", help="DDP's all-reduce instead of the hook")
parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
parser.add_argument("--seed", type=int, default=0, help="seed of the data and weights")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(args.seed)  # the same data and initial weights on every rank
inputs = torch.randn(4096, 32)
targets = 3 * torch.tanh(inputs @ torch.randn(32, 1)) + inputs[:, :1] ** 2
layers = [torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = DistributedDataParallel(torch.nn.Sequential(*layers, torch.nn.Linear(256, 1)))
momentum = 0.9
if not args.dense:
    state = SparDLState(density=0.05, method="spardl", model=model, momentum=momentum)
    model.register_comm_hook(state, spardl_hook)
    momentum = 0.0  # the hook applies it
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
batches = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own batches
for _ in range(args.steps):
    pick = torch.randint(0, len(inputs), (32,), generator=batches)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(inputs[pick]), targets[pick]).backward()
    optimizer.step()
with torch.no_grad():
    loss = torch.nn.functional.mse_loss(model(inputs), targets).item()
if rank == 0:
    print(
        f"{'dense DDP' if args.dense else 'spardl hook'}: loss {loss:.4f} after {args.steps} steps"
    )
dist.destroy_process_group()
