"""FSDP2 with the sparse reduce-scatter and the sparse replica hook, under torchrun (Gloo, CPU).

``torchrun --standalone --nproc-per-node 4 tests/fsdp_check.py`` (2 or 4 ranks): at density 1
every registered method's reduce-scatter gives FSDP's own gradients, with FSDP's AVG and with
sums forced (the model has 3 parameter groups and, at P = 4, a bias of 3 entries, fewer than
P); the replica hook over 2 "hosts" of 2 ranks gives plain FSDP's over all 4 and leaves the
replicas with the same bits; a sparse run learns with the same weights on every rank; states
round-trip and reshard to P + 1 ranks per parameter (the layout attach recorded); with
``residual_dtype="bf16"`` density 1 still gives FSDP's gradients and the
modules share one float32 synchronizer per size; FSDP2's mixed precision (bf16 parameters, fp32
reduction) works. Rank 0 prints "passed".
"""

import io
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import compressors
from compressors.fsdp import SparseReduceScatter, attach, host_groups, sparse_replica_hook
from compressors.fsdp_layout import unpadded
from compressors.reshard import pending_update

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def model(mesh_group=None):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    mesh = None
    if mesh_group is not None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(mesh_group, "cpu")
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def gradients(net, steps=1, optimizer=None):
    for step in range(steps):
        x = torch.randn(6, 12, generator=torch.Generator().manual_seed(100 * step + rank))
        net.zero_grad()
        net(x).square().mean().backward()
        if optimizer is not None:
            optimizer.step()
    return [p.grad.full_tensor() for p in net.parameters()]


def close(first, second, what, tolerance=1e-6):
    for a, b in zip(first, second):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance), (what, (a - b).abs().max())


native = gradients(model())
for method in compressors.available():
    for force_sum in (False, True):
        net = model()
        attach(net, method, density=1.0)
        if force_sum:
            for module in net.modules():
                if hasattr(module, "set_force_sum_reduction_for_comms"):
                    module.set_force_sum_reduction_for_comms(True)
        close(gradients(net), native, f"{method} at density 1, sums forced: {force_sum}")

# A sparse run: it learns, every rank's weights agree, the residuals round-trip.
net = model()
comms = attach(net, "spardl", density=0.1, wire="fp16")
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
gradients(net, steps=10, optimizer=optimizer)
weights = [p.full_tensor() for p in net.parameters()]
for weight in weights:
    copies = [torch.empty_like(weight) for _ in range(world)]
    dist.all_gather(copies, weight)
    assert all(torch.equal(copy, weight) for copy in copies), "ranks differ"
buffer = io.BytesIO()
torch.save({name: comm.state_dict() for name, comm in comms.items()}, buffer)
buffer.seek(0)
saved = torch.load(buffer, weights_only=True)
again = SparseReduceScatter("spardl", None, 0.1, wire="fp16")
again.load_state_dict(saved["0"])
assert any(state["residual"].abs().sum() > 0 for state in saved["0"]["synchronizers"].values())
# attach recorded each group's layout, FSDP2's vector length at this P: the residuals reshard
# to P + 1 ranks per parameter, the pending update kept and the padding rows empty.
everyone = [None] * world
dist.all_gather_object(everyone, saved)
for name, state in saved.items():
    if not state["synchronizers"]:
        continue  # the root holds no parameter of its own
    (numel,) = state["synchronizers"]
    shapes = state["layouts"][numel]
    assert shapes is not None, f"module {name!r}: no layout recorded"
    states = [mine[name] for mine in everyone]
    new = compressors.reshard(states, world + 1)
    (target,) = new[0]["synchronizers"]
    before = unpadded(
        pending_update([s["synchronizers"][numel] for s in states]).float(), shapes, world
    )
    after = pending_update([s["synchronizers"][target] for s in new]).float()
    assert torch.allclose(unpadded(after, shapes, world + 1), before, atol=1e-6), name

# residual_dtype="bf16": FSDP's gradients at density 1; sparse, the modules share float32 work.
for method in ("spardl", "topk"):
    net = model()
    attach(net, method, density=1.0, residual_dtype="bf16")
    close(gradients(net), native, f"{method} with bf16 residuals at density 1")
net = model()
comms = attach(net, "spardl", density=0.1, residual_dtype="bf16")
gradients(net, steps=3, optimizer=torch.optim.SGD(net.parameters(), lr=0.05))
assert len({id(comm.synchronizers) for comm in comms.values()}) == 1, "not shared"
states = [state for comm in comms.values() for state in comm.state_dict()["synchronizers"].values()]
assert states and all(state["residual"].dtype == torch.bfloat16 for state in states)
assert any(state["residual"].abs().sum() > 0 for state in states)

try:
    SparseReduceScatter("spardl", None, 0.1, nope=1)
    raise AssertionError("an unknown option was taken")
except ValueError as error:
    assert "unknown option" in str(error)

# FSDP2 mixed precision (bf16 parameters, fp32 reduction): the sparse reduce-scatter gets fp32.
from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: E402

torch.manual_seed(0)
mixed = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in (mixed[0], mixed[2]):
    fully_shard(layer, mp_policy=policy)
fully_shard(mixed, mp_policy=policy)
attach(mixed, "spardl", density=0.5)
grads = gradients(mixed)
assert all(torch.isfinite(g).all() for g in grads), "mixed precision gave a non-finite gradient"

if world == 4:  # sparse hybrid sharding: 2 hosts of 2 ranks
    shard_group, replica_group = host_groups(2)
    for method in ("spardl", "topk"):
        for residual_dtype in ("fp32", "bf16"):
            net = model(shard_group)
            attach(net, method, 1.0, replica_group=replica_group, residual_dtype=residual_dtype)
            close(gradients(net), native, f"{method} replica hook at density 1, {residual_dtype}")
    net = model(shard_group)
    hooks = attach(net, "spardl", density=0.1, replica_group=replica_group)
    gradients(net, steps=3, optimizer=torch.optim.SGD(net.parameters(), lr=0.05))
    assert all(isinstance(h, type(sparse_replica_hook())) for h in hooks.values())
    for parameter in net.parameters():  # the replicas of a shard hold the same bits
        shard = parameter.to_local().contiguous()
        copies = [torch.empty_like(shard) for _ in range(2)]
        dist.all_gather(copies, shard, group=replica_group)
        assert torch.equal(copies[0], copies[1]), "replicas differ after the replica hook"

dist.barrier()
if rank == 0:
    print(f"fsdp checks passed on {world} ranks", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
