"""Run under ``torchrun --nproc-per-node P``: the DDP hook on Gloo against plain DDP."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hooks  # noqa: E402

dist.init_process_group("gloo")
rank, workers = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 300))


def train(ddp, steps=6):
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        inputs, targets = torch.randn(8, 20, generator=generator), torch.randint(0, 300, (8,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def same_everywhere(vector):
    gathered = [torch.empty_like(vector) for _ in range(workers)]
    dist.all_gather(gathered, vector)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def recording_hook(results):
    """:func:`hooks.spardl_hook` that also notes which tensor each bucket's future returned."""
    def hook(state, bucket):
        future = hooks.spardl_hook(state, bucket)
        results.setdefault((bucket.index(), bucket.buffer().numel()), set()).add(future.value().data_ptr())
        return future
    return hook


# 1.3 MB of parameters in 0.25 MB buckets (the first bucket takes up to 1 MB): several buckets
plain = train(DistributedDataParallel(model(), bucket_cap_mb=0.25))
for method, as_view in (("spardl", False), ("spardl", True), ("dense", False)):
    ddp = DistributedDataParallel(model(), bucket_cap_mb=0.25, gradient_as_bucket_view=as_view)
    results = {}
    ddp.register_comm_hook(hooks.SparDLState(density=1.0, method=method), recording_hook(results))
    assert torch.allclose(train(ddp), plain, atol=1e-5), f"{method} at density 1 differs from DDP"
    assert all(len(buffers) == 1 for buffers in results.values()), f"a bucket got new results: {results}"

sparse = DistributedDataParallel(model(), bucket_cap_mb=0.25)
state = hooks.SparDLState(density=0.05, method="spardl")
sparse.register_comm_hook(state, hooks.spardl_hook)
params = train(sparse)
assert same_everywhere(params), "parameters differ across ranks"
assert len(state.synchronizers) >= 2, f"expected several buckets: {list(state.synchronizers)}"
saved = state.state_dict()
restored = hooks.SparDLState(density=0.05, method="spardl")
restored.load_state_dict(saved)
assert restored.state_dict()["buckets"].keys() == saved["buckets"].keys()
assert not torch.equal(params, plain), "density 0.05 should differ from dense DDP"
dist.barrier()
if rank == 0:
    print(f"ddp hook checks passed on {workers} ranks")
dist.destroy_process_group()
