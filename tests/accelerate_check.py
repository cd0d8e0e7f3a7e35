"""Run under ``torchrun --nproc-per-node 2`` (CPU): the hook on the model accelerate prepares.

accelerate's own ``comm_hook`` setting takes only its built-in hooks, so the hook is registered
on the DDP model that ``Accelerator.prepare`` returns, as docs/DDP_HOOK.md shows.
"""

import os
import sys

import torch
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel

from compressors.ddp import SparDLState, spardl_hook

torch.set_num_threads(1)
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(256, 32, generator=generator)
data = torch.utils.data.TensorDataset(inputs, inputs[:, :4].sum(1).gt(0).long())
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
assert isinstance(model, DistributedDataParallel), type(model)

# The example of docs/DDP_HOOK.md:
state = SparDLState(density=0.05, method="spardl", model=model)
model.register_comm_hook(state, spardl_hook)

sent, losses = 0, []
for _epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        sent += state.take_stats()["bytes_sent"]
        losses.append(loss.item())

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = accelerator.gather(flat.unsqueeze(0))
assert all(torch.equal(row, gathered[0]) for row in gathered), "parameters differ across ranks"
assert sent > 0, "the hook sent nothing"
assert state.synchronizers, "the hook never ran"
assert sum(losses[-8:]) < sum(losses[:8]), f"no learning: {losses[:8]} -> {losses[-8:]}"
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    print(f"accelerate hook checks passed on {accelerator.num_processes} ranks, {sent} bytes sent")
sys.stdout.flush()
os._exit(0)  # as tests/ddp_check.py: no Gloo teardown at interpreter shutdown
