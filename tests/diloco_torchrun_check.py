"""Run under ``torchrun --nproc-per-node 2`` (Gloo, CPU): ``compressors.diloco.DiLoCo`` over a
``torch.distributed`` process group gives every rank the same parameters after every outer step,
the same bits as the in-process transport, and its state round-trips through a checkpoint."""

import torch
import torch.distributed as dist

from allreducers.transports import local_group
from compressors.diloco import DiLoCo

dist.init_process_group("gloo")
rank, workers = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def train(comm, rank, steps=6):
    # Every rank its own start (DiLoCo starts them all from rank 0's), from its own generator:
    # the in-process ranks are threads, which would race for torch's global one.
    model = torch.nn.Sequential(torch.nn.Linear(12, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    draws = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=draws) * 0.2)
    outer = DiLoCo(model, comm=comm, method="spardl", density=0.1, local_steps=2, wire="fp16")
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)
    after = []
    for _ in range(steps):
        inputs, targets = (
            torch.randn(8, 12, generator=data),
            torch.randint(0, 3, (8,), generator=data),
        )
        inner.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        inner.step()
        if outer.step():
            after.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return after, outer.state_dict()


after, state = train(dist.group.WORLD, rank)
assert len(after) == 3 and state["outer_steps"] == 3
for vector in after:
    gathered = [torch.empty_like(vector) for _ in range(workers)]
    dist.all_gather(gathered, vector)
    assert all(torch.equal(g, vector) for g in gathered), "ranks differ after an outer step"
reference = local_group(workers).run(lambda transport: train(transport, transport.rank)[0])
assert all(torch.equal(a, b) for a, b in zip(after, reference[rank])), "torch.distributed != local"
dist.barrier()
if rank == 0:
    print("diloco over torch.distributed: ok")
dist.destroy_process_group()
