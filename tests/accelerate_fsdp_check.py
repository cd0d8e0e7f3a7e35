"""Run under ``torchrun --nproc-per-node 2`` (CPU, Gloo): attach on accelerate's FSDP2 model.

The lines of docs/FSDP.md: ``FullyShardedDataParallelPlugin(fsdp_version=2)``, the model and
optimizer through ``Accelerator.prepare`` together, then ``attach`` on the prepared model. At
density 1 spardl's and topk's sharded gradients equal FSDP's own reduce-scatter's (no attach)
over the same steps; at density 0.1 the run trains, every rank keeps a non-zero residual per
parameter group and every synchronizer was called and sent bytes. Rank 0 prints "passed".

accelerate 1.15 takes FSDP only on accelerators (CUDA and the like): on the CPU it leaves the
plugin unused and ``prepare`` wraps the model in DDP, where ``attach`` finds no FSDP module.
So here, and only on the CPU, the accelerator's state is set to FSDP as accelerate itself sets
it on a GPU (``AcceleratorState.__init__``); ``prepare`` then applies FSDP2 over Gloo.
"""

import math
import os
import sys

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.state import PartialState
from accelerate.utils import DistributedType
from torch.distributed.fsdp import FSDPModule

from compressors.fsdp import attach

torch.set_num_threads(1)

# The lines a user adds (docs/FSDP.md), the model's Linear layers each an FSDP module:
plugin = FullyShardedDataParallelPlugin(
    fsdp_version=2,
    auto_wrap_policy="transformer_based_wrap",
    transformer_cls_names_to_wrap=["Linear"],
)
accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
if accelerator.distributed_type == DistributedType.MULTI_CPU:  # the CPU only: see above
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
assert accelerator.is_fsdp2, accelerator.distributed_type
rank, world = accelerator.process_index, accelerator.num_processes


def run(method=None, density=1.0, steps=3):
    """Train ``steps`` steps; return each step's sharded gradients, the losses, the comms."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    comms = attach(model, method, density=density) if method else {}
    grads, losses = [], []
    for step in range(steps):
        x = torch.randn(6, 12, generator=torch.Generator().manual_seed(100 * step + rank))
        optimizer.zero_grad()
        loss = model(x).square().mean()
        accelerator.backward(loss)
        grads.append([p.grad.to_local().clone() for p in model.parameters()])
        optimizer.step()
        losses.append(loss.item())
    return model, grads, losses, comms


def groups(model):
    """The names of the FSDP modules that hold parameters of their own (a reduce-scatter each)."""
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, FSDPModule)
        and next(module.parameters(recurse=False), None) is not None
    }


def check_called(model, comms, steps):
    """Every parameter group's synchronizer ran once a step and sent bytes."""
    assert set(comms) == {n for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    owners = groups(model)
    assert len(owners) == 2, owners  # the two Linear layers
    for name in owners:
        syncs = comms[name].synchronizers
        assert syncs, f"the reduce-scatter of {name!r} never ran"
        for sync in syncs.values():
            assert sync.calls == steps, (name, sync.calls)
            assert sync.stats["bytes_sent"] > 0, (name, sync.stats)


model, native, _, _ = run()
assert isinstance(model, FSDPModule), type(model)
assert groups(model) == {"0", "2"}, groups(model)

# (a) density 1: FSDP's own gradients, shard by shard, step by step.
for method in ("spardl", "topk"):
    model, grads, _, comms = run(method, 1.0)
    check_called(model, comms, steps=3)
    for step, (ours, theirs) in enumerate(zip(grads, native)):
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and a.numel() > 0, (a.shape, b.shape)
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), (method, step, (a - b).abs().max())

# (b) density 0.1: it trains, the residuals hold what was not sent, the synchronizers ran.
model, _, losses, comms = run("spardl", 0.1, steps=10)
assert all(math.isfinite(loss) for loss in losses), losses
check_called(model, comms, steps=10)
for name in groups(model):
    states = comms[name].state_dict()["synchronizers"]
    assert states, name
    for state in states.values():
        assert state["residual"].abs().sum() > 0, f"rank {rank}: empty residual in {name!r}"

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    trained = f"losses {losses[0]:.4f} -> {losses[-1]:.4f}"
    print(f"accelerate fsdp2 checks passed on {world} ranks, {trained}", flush=True)
sys.stdout.flush()
os._exit(0)  # as tests/fsdp_check.py: no Gloo teardown at interpreter shutdown
