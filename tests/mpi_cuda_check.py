"""Under mpiexec with a GPU: every method over MPI on CUDA gradients, against the CPU.

Each method runs three calls twice on the same communicator, once on CUDA tensors and once on
the same gradients on the CPU: the CUDA results are the same bits on every rank, match the CPU's,
and conserve mass like them. With an MPI that is not CUDA-aware, the transport stages the device
tensors through the host and waits for the GPU at most once per round (``stats["host_syncs"]``);
``torch.cuda.set_sync_debug_mode`` counts every host synchronization of a call, the
transport's included (the third call's is printed): for SparDL and TopkA no more than their
rounds (SparDL with two teams: one more, B-SAG's union size), with ``count_nnz`` off as the
trainer, the hook and the bench run them.
Prints one line per case and ``mpi cuda checks passed``.
"""

import hashlib
import sys

import numpy as np
import torch
from mpi4py import MPI

import compressors
from allreducers.transports.mpi import MPITransport
from syncbench.opcount import host_syncs

NUMEL = 100_003
DENSITY = 0.01
#: Methods whose every round is one exchange: the transport waits for the GPU once per round.
ROUND_PER_WAIT = ("spardl", "topk")


def cases(size: int) -> list:
    """Every registered method, and SparDL at the fp16 wire and with two teams where P allows."""
    chosen = [(name, {}) for name in compressors.available()]
    chosen.append(("spardl", {"wire": "fp16"}))
    if size % 2 == 0 and size > 2:
        chosen.append(("spardl", {"teams": 2}))
    return chosen


def gradient(rank: int, call: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    scale = torch.randn(NUMEL, generator=torch.Generator().manual_seed(7)).mul_(0.8).exp_()
    return torch.randn(NUMEL, generator=generator).mul_(scale)


def check(transport, comm, name: str, options: dict, device) -> dict:
    """Three calls on CUDA and on the CPU; the most host synchronizations of a call."""
    on_gpu = compressors.create(name, transport, numel=NUMEL, density=DENSITY, **options)
    on_gpu.count_nnz = False  # as the trainer, the hook and the bench run it: no read for nnz
    on_cpu = compressors.create(name, transport, numel=NUMEL, density=DENSITY, **options)
    counted = {"rounds": 0, "host_syncs": 0, "host_sync_ops": 0}
    for call in range(3):
        grad = gradient(transport.rank, call)
        before = on_gpu.residual.double().cpu()
        on_device = grad.to(device)
        torch.cuda.synchronize(device)
        with host_syncs() as syncs:
            result = on_gpu.allreduce(on_device)
        if call == 2:
            counted["host_sync_ops"] = syncs["count"]
        counted["rounds"] = max(counted["rounds"], on_gpu.stats["rounds"])
        counted["host_syncs"] = max(counted["host_syncs"], on_gpu.stats["host_syncs"])
        expected = on_cpu.allreduce(grad)
        assert result.is_cuda, name
        host = result.cpu()
        digests = comm.allgather(hashlib.sha256(host.numpy().tobytes()).hexdigest())
        assert len(set(digests)) == 1, f"{name} {options}: ranks differ at call {call}"
        np.testing.assert_allclose(host.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        if on_gpu.conserves_mass:
            mass = grad.double() + before - on_gpu.residual.double().cpu()
            total = comm.allreduce(mass.numpy(), op=MPI.SUM)
            scale = np.abs(total).max() + 1
            assert np.abs(total - transport.size * host.double().numpy()).max() <= 1e-5 * scale
    if transport.size > 1 and name in ROUND_PER_WAIT:
        assert counted["host_syncs"] <= counted["rounds"], (name, options, counted)
        # B-SAG reads one value a call, the previous call's union size (its adaptive h).
        allowed = counted["rounds"] + (options.get("teams", 1) > 1)
        if not transport.device_buffers_ok:
            assert counted["host_sync_ops"] <= allowed, (name, options, counted)
    return counted


def main() -> None:
    comm = MPI.COMM_WORLD
    transport = MPITransport(comm)
    device = torch.device("cuda", transport.rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    for name, options in cases(transport.size):
        counted = check(transport, comm, name, options, device)
        if transport.rank == 0:
            print(
                f"{name} {options}: P={transport.size} rounds {counted['rounds']} "
                f"transport waits {counted['host_syncs']} all host syncs "
                f"{counted['host_sync_ops']} (cuda-aware: {transport.device_buffers_ok})",
                flush=True,
            )
    comm.Barrier()
    if transport.rank == 0:
        print("mpi cuda checks passed", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
