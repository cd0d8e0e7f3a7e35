"""Run under ``torchrun --nproc-per-node 2`` (CPU, Gloo): the DDP hook and the FSDP seams in
Lightning, the ways docs/DDP_HOOK.md and docs/FSDP.md show.

- **DDP hook.** Lightning's ``DDPStrategy(ddp_comm_hook=...)`` registers hooks only on CUDA, so
  on the CPU a callback registers the hook at ``on_fit_start``, when the strategy has wrapped
  the model in DDP. At density 1 the gradients equal DDP's own all-reduce's (no hook), step by
  step, the same bits on both ranks; at density 0.1 the hook ran and the residuals hold what
  was not sent.
- **FSDP2.** ``ModelParallelStrategy`` with ``attach`` at the end of ``configure_model``: at
  density 1 spardl's sharded gradients equal FSDP's own reduce-scatter's; at density 0.1 every
  parameter group's synchronizer ran each step.

Rank 0 prints "lightning cpu checks passed".
"""

import os
import sys

import torch
import torch.distributed as dist

try:
    import lightning.pytorch as L
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
except ImportError:  # the package name pytorch-lightning installs
    import pytorch_lightning as L
    from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy

from torch.distributed.fsdp import FSDPModule, fully_shard

from compressors.ddp import SparDLState, spardl_hook
from compressors.fsdp import attach

torch.set_num_threads(1)
STEPS = 4


class RegisterCommHook(L.Callback):
    """The hook on the CPU: registered once the strategy has wrapped the model in DDP."""

    def __init__(self, state, hook):
        self.state, self.hook = state, hook

    def on_fit_start(self, trainer, pl_module):
        trainer.strategy.model.register_comm_hook(self.state, self.hook)


class Gradients(L.Callback):
    """Each step's gradients (local shards under FSDP), kept for the comparison."""

    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters()]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # FSDP: a DTensor
        self.steps.append([g.detach().clone() for g in local])


class Regression(L.LightningModule):
    def __init__(self, method=None, density=1.0):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(12, 40), torch.nn.ReLU(), torch.nn.Linear(40, 3)
        )
        self.method, self.density, self.comms = method, density, {}

    def configure_model(self):  # ModelParallelStrategy only: FSDP2, then the seams
        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
        if self.method:
            self.comms = attach(self.net, self.method, density=self.density)

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 2 * STEPS, 12, generator=generator)
    y = x[:, :3] * 2 - x[:, 3:6]
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def fit(strategy, model, callbacks=()):
    gradients = Gradients()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=STEPS,
        callbacks=[*callbacks, gradients],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data())
    assert len(gradients.steps) == STEPS, len(gradients.steps)
    return gradients.steps


def same_on_every_rank(steps):
    for step in steps:
        flat = torch.cat([g.flatten() for g in step])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        assert all(torch.equal(flat, other) for other in gathered), "ranks differ"


def close(ours, theirs, what):
    for step, (a_step, b_step) in enumerate(zip(ours, theirs)):
        for a, b in zip(a_step, b_step):
            assert a.shape == b.shape and a.numel() > 0, (what, a.shape, b.shape)
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (what, step, (a - b).abs().max())


def ddp_strategy():
    return DDPStrategy(process_group_backend="gloo")


# DDP: the hook through a callback, against DDP's own all-reduce.
native = fit(ddp_strategy(), Regression())
model = Regression()
state = SparDLState(density=1.0, method="spardl", model=model)
hooked = fit(ddp_strategy(), model, [RegisterCommHook(state, spardl_hook)])
assert state.synchronizers, "the hook never ran"
same_on_every_rank(hooked)
close(hooked, native, "ddp hook at density 1")

model = Regression()
state = SparDLState(density=0.1, method="spardl", model=model)
fit(ddp_strategy(), model, [RegisterCommHook(state, spardl_hook)])
assert state.synchronizers, "the hook never ran"
for sync in state.synchronizers.values():
    assert sync.calls == STEPS and sync.stats["bytes_sent"] > 0, (sync.calls, sync.stats)
    assert sync.residual.abs().sum() > 0, "an empty residual at density 0.1"

# FSDP2: ModelParallelStrategy, attach in configure_model.
native = fit(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), Regression())
model = Regression("spardl", 1.0)
sharded = fit(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), model)
close(sharded, native, "fsdp2 at density 1")
model = Regression("spardl", 0.1)
fit(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), model)
owners = [n for n, m in model.net.named_modules() if isinstance(m, FSDPModule)]
called = [sync for name in owners for sync in model.comms[name].synchronizers.values()]
assert len(called) == 2, (owners, len(called))  # the two Linear layers
assert all(sync.calls == STEPS and sync.stats["bytes_sent"] > 0 for sync in called)

if dist.get_rank() == 0:
    print(f"lightning cpu checks passed on {dist.get_world_size()} ranks", flush=True)
sys.stdout.flush()
os._exit(0)  # as tests/fsdp_check.py: no Gloo teardown at interpreter shutdown
