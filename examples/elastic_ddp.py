"""DDP with the SparDL hook under torchrun's elastic agent: workers die, the survivors go on.

    torchrun --nnodes 1:2 --nproc-per-node 2 --max-restarts 3 \\
        --rdzv-backend c10d --rdzv-endpoint localhost:29400 --rdzv-id demo \\
        examples/elastic_ddp.py --checkpoint-dir ckpt --steps 200 --checkpoint-every 20

Every rank saves its state every ``--checkpoint-every`` steps (``ckpt/step-000040/``: the
model, the optimizer and the hook's error-feedback state, one file per rank, and ``WORLD``,
the number of ranks). When a worker dies, torchrun's agents stop the others and start them all
again on whatever joined the new rendezvous; each worker then loads the newest complete
checkpoint, reshards the hook's state of the old ranks to the new world size
(``compressors.reshard``: the pending update, sum(residual) / P, is kept) and goes on. Rank 0
prints one line per (re)start saying what it resumed and, after a failure, how long it took
from the death to training again. docs/ELASTIC.md explains the setup; tests/test_elastic_ddp.py
runs it with two agents and kills one.

``--die-at-step N --die-rank R`` (tests) makes rank R of the first attempt kill itself at step
N, as a lost worker would be; ``--dense`` runs plain DDP (no hook) for comparison. Use an
explicit c10d rendezvous: under ``--standalone`` torch 2.14's restarts often reconnect to the
previous attempt's addresses, even for plain DDP.
"""

import argparse
import os
import re
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import compressors
from compressors.ddp import SparDLState, spardl_hook

STEP_DIR = re.compile(r"step-(\d+)$")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--checkpoint-dir", required=True, help="shared by every worker")
parser.add_argument("--steps", type=int, default=200, help="optimizer steps in all (default 200)")
parser.add_argument("--checkpoint-every", type=int, default=20, metavar="STEPS")
parser.add_argument("--density", type=float, default=0.05)
parser.add_argument("--dense", action="store_true", help="plain DDP: DDP's own all-reduce")
parser.add_argument("--die-at-step", type=int, default=0, metavar="N", help="(tests) see above")
parser.add_argument("--die-rank", type=int, default=1, metavar="R")
parser.add_argument("--seed", type=int, default=0)


def newest_complete(directory: Path):
    """``(step, world)`` of the newest checkpoint every one of whose ranks' files is there."""
    found = []
    for entry in directory.glob("step-*") if directory.is_dir() else []:
        match, world = STEP_DIR.match(entry.name), entry / "WORLD"
        if match and world.is_file():
            size = int(world.read_text())
            if all((entry / f"rank-{rank:04d}.pt").is_file() for rank in range(size)):
                found.append((int(match.group(1)), size))
    return max(found) if found else (0, None)


def save(directory: Path, step: int, rank: int, size: int, state: dict) -> None:
    """This rank's file of ``step``, atomically (``WORLD`` from rank 0)."""
    target = directory / f"step-{step:06d}"
    target.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (target / "WORLD.tmp").write_text(f"{size}\n")
        os.replace(target / "WORLD.tmp", target / "WORLD")
    torch.save(state, target / f"rank-{rank:04d}.pt.tmp")
    os.replace(target / f"rank-{rank:04d}.pt.tmp", target / f"rank-{rank:04d}.pt")


def main() -> None:
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    directory = Path(args.checkpoint_dir)
    torch.manual_seed(args.seed)  # the same data and initial weights on every rank
    inputs = torch.randn(2048, 32)
    targets = 3 * torch.tanh(inputs @ torch.randn(32, 1)) + inputs[:, :1] ** 2
    layers = [torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers))
    state = None
    if not args.dense:
        state = SparDLState(density=args.density, method="spardl", model=model, momentum=0.9)
        model.register_comm_hook(state, spardl_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.0 if state else 0.9)
    resumed, world = newest_complete(directory)
    if world is not None:
        saved = [
            torch.load(directory / f"step-{resumed:06d}" / f"rank-{r:04d}.pt") for r in range(world)
        ]
        model.module.load_state_dict(saved[0]["model"])
        optimizer.load_state_dict(saved[0]["optimizer"])
        if state is not None:
            state.load_state_dict(compressors.reshard([s["hook"] for s in saved], size)[rank])
    if rank == 0 and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1":
        print(
            "elastic_ddp: warning: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun, or a "
            "restart may read the previous attempt's addresses (docs/ELASTIC.md)",
            flush=True,
        )
    if rank == 0:
        died = directory / "died"
        since = (
            f", training again {time.time() - float(died.read_text()):.1f} s after a worker died"
            if died.is_file()
            else ""
        )
        what = f"resumed step {resumed} of a {world}-rank run" if world else "started"
        print(f"elastic_ddp: {what} on {size} ranks at {time.time():.3f}{since}", flush=True)
    for step in range(resumed + 1, args.steps + 1):
        if args.die_at_step == step and rank == args.die_rank and not (directory / "died").exists():
            (directory / "died").write_text(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        batches = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
        pick = torch.randint(0, len(inputs), (32,), generator=batches)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[pick]), targets[pick]).backward()
        optimizer.step()
        if step % args.checkpoint_every == 0:
            hook = state.state_dict() if state is not None else {}
            checkpoint = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "hook": hook,
            }
            save(directory, step, rank, size, checkpoint)
            old = directory / f"step-{step - 2 * args.checkpoint_every:06d}"
            if rank == 0 and old.is_dir():  # complete long since: every rank is past it
                shutil.rmtree(old, ignore_errors=True)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(inputs), targets).item()
    if rank == 0:
        print(
            f"elastic_ddp: finished step {args.steps} on {size} ranks, loss {loss:.4f}", flush=True
        )
    if state is not None:
        state.pipeline.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
