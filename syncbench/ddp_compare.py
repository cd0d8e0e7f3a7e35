"""DDP with each of a list of communication hooks, timed side by side in one interleaved run.

    torchrun --standalone --nproc-per-node 4 scripts/ddp_compare.py \
        --hooks compute,ddp,ddp_fp16,powersgd,topk,spardl --density 0.01

One DistributedDataParallel model per hook (same initial weights, Gloo), each trained on the same
synthetic batch; every iteration runs one training step (forward, backward with the hook, SGD
step) of every hook in turn, so drift of the machine hits all of them alike. An iteration's time
is that of its slowest rank; the table shows the median over the timed iterations, the median
exposed wait (from the last parameter gradient accumulated to backward's return: the
synchronization left after compute) and the ratio to ``compute`` (a hook that returns the bucket
unchanged: compute alone). For a registered method's hook, three more medians per iteration
(its slowest rank's) tell where its communication thread's time went: ``thread s``, the
buckets' time on that thread; ``CPU s``, the CPU time it spent on them; ``transport s``, the
time inside the transport's sends, receives and waits (the synchronizers' ``comm`` phase). A
thread that takes much longer than its CPU time waited: for its peers, or, on a machine with
fewer cores than threads, for a core.

Hooks: ``compute``; ``ddp`` (DDP's own all-reduce, no hook); ``ddp_fp16`` and ``ddp_bf16``
(torch's ``fp16_compress_hook`` / ``bf16_compress_hook``); ``powersgd`` (torch's
``powerSGD_hook``, ``--powersgd-rank``, ``--powersgd-start-iter``; on Gloo one bucket for the
whole model, with a note: with several, its chained all-reduces are issued from callback threads
in different orders on different ranks and Gloo aborts); and any registered method of
``compressors`` through :func:`compressors.ddp.spardl_hook` (``spardl``, ``topk``, ...), at
``--density``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as functional

import compressors
from syncbench.gradients import trainer_package

__all__ = [
    "TORCH_HOOKS",
    "DEFAULT_HOOKS",
    "THREAD_PARTS",
    "build_parser",
    "check",
    "synthetic_batch",
    "wrap",
    "measure",
    "release",
    "summarize",
    "format_table",
    "main",
]

#: The hooks that are not registered methods of ``compressors``.
TORCH_HOOKS = ("compute", "ddp", "ddp_fp16", "ddp_bf16", "powersgd")
DEFAULT_HOOKS = "compute,ddp,ddp_fp16,powersgd,topk,spardl"
#: Synthetic inputs: CIFAR-shaped images, or token sequences for the text models.
IMAGE_SHAPE, CLASSES, SEQUENCE, VOCAB = (3, 32, 32), 10, 128, 10_000
#: Per iteration, where a registered method's communication thread spent its time: the
#: buckets' seconds on it, its CPU seconds, and the seconds inside the transport.
THREAD_PARTS = ("thread_s", "thread_cpu_s", "transport_s")


class _Parser(argparse.ArgumentParser):
    """Prints (help, usage errors) from rank 0 only; a usage error is one line, status 2."""

    def _print_message(self, message, file=None):
        if os.environ.get("RANK", "0") == "0":
            super()._print_message(message, file)

    def error(self, message):
        """Exit with status 2 after one line."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/ddp_compare.py``."""
    parser = _Parser(
        prog="ddp_compare.py",
        description="DDP with each hook, timed side by side in one interleaved run "
        "(run under torchrun; Gloo).",
        epilog="The table: per hook the median seconds per iteration (its slowest rank's), "
        "min, max, the exposed wait (last gradient to backward's return) and the ratio to "
        "compute alone; for a registered method's hook also its communication thread's "
        "seconds per iteration (thread s), their CPU time (CPU s) and the time inside the "
        "transport (transport s): a thread much slower than its CPU time waited, for its "
        "peers or for a core.",
    )
    parser.add_argument("--model", default="vgg16", help="a model of the models registry")
    parser.add_argument(
        "--hooks",
        default=DEFAULT_HOOKS,
        help=f"comma-separated: {', '.join(TORCH_HOOKS)} or a registered method "
        f"({', '.join(compressors.available())}), which may take its options after colons, "
        f"e.g. spardl:wire=fp16:teams=2 (default: {DEFAULT_HOOKS})",
    )
    parser.add_argument("--density", type=float, default=0.01, help="registered methods' density")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations (default: 10)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed iterations first (default: 2)"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank")
    parser.add_argument(
        "--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (default: 25)"
    )
    parser.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD's rank (4)")
    parser.add_argument(
        "--powersgd-start-iter",
        type=int,
        default=2,
        help="the iteration PowerSGD starts at, dense all-reduce before (default: 2, the "
        "first torch allows); keep --warmup at least this so only PowerSGD is timed",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    return parser


def check(args, parser) -> list:
    """Validate ``args`` (exit 2 with one line); return the hook names."""
    hooks = [name.strip() for name in args.hooks.split(",") if name.strip()]
    models = trainer_package("models")  # the repository's registry (not installed)

    for hook in hooks:
        name, *texts = hook.split(":")
        if name in TORCH_HOOKS and texts:
            parser.error(f"hook {hook!r}: {name} takes no options after ':'")
        if name not in TORCH_HOOKS:
            try:
                compressors.resolve(name)
            except ValueError:
                parser.error(
                    f"unknown hook {name!r}; choose from {', '.join(TORCH_HOOKS)} or "
                    f"{', '.join(compressors.available())}"
                )
            try:
                compressors.parse_options(name, texts)
            except ValueError as error:
                parser.error(f"hook {hook!r}: {error}")
    problems = [
        (not hooks, "--hooks names no hook"),
        (len(set(hooks)) != len(hooks), "--hooks names a hook twice"),
        (
            args.model not in models.available(),
            f"unknown model {args.model!r}; choose one of: {', '.join(models.available())}",
        ),
        (not 0 < args.density <= 1, f"--density must lie in (0, 1], got {args.density}"),
        (args.iters < 1, f"--iters must be at least 1, got {args.iters}"),
        (args.warmup < 0, f"--warmup must be at least 0, got {args.warmup}"),
        (args.batch_size < 1, f"--batch-size must be at least 1, got {args.batch_size}"),
        (not 0 < args.bucket_mb < math.inf, f"--bucket-mb must be above 0, got {args.bucket_mb}"),
        (args.powersgd_rank < 1, f"--powersgd-rank must be at least 1, got {args.powersgd_rank}"),
        (args.powersgd_start_iter < 2, "--powersgd-start-iter must be at least 2"),
    ]
    for bad, message in problems:
        if bad:
            parser.error(message)
    return hooks


def synthetic_batch(model_name: str, batch: int, seed: int):
    """``(model, inputs, labels)``: the model and one synthetic batch for it."""
    models = trainer_package("models")

    generator = torch.Generator().manual_seed(seed)
    kind = models.task(model_name)
    if kind == "image-classification":
        model = models.create(model_name, CLASSES, IMAGE_SHAPE)
        inputs = torch.randn(batch, *IMAGE_SHAPE, generator=generator)
        labels = torch.randint(0, CLASSES, (batch,), generator=generator)
    else:
        classes = 2 if kind == "text-classification" else VOCAB
        model = models.create(model_name, classes, (SEQUENCE,), vocab_size=VOCAB)
        inputs = torch.randint(0, VOCAB, (batch, SEQUENCE), generator=generator)
        shape = (batch,) if kind == "text-classification" else (batch, SEQUENCE)
        labels = torch.randint(0, classes, shape, generator=generator)
    return model, inputs, labels


def _compute_hook(_, bucket):
    """A hook that returns the bucket unchanged: no communication (compute alone)."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def wrap(name: str, model, args, note) -> torch.nn.Module:
    """``model`` (a copy) in DDP with hook ``name`` registered."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel

    from compressors.ddp import SparDLState, spardl_hook

    bucket_mb = args.bucket_mb
    whole_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    if name == "powersgd" and dist.get_backend() == "gloo" and whole_mb > bucket_mb:
        bucket_mb = math.ceil(whole_mb) + 1.0
        note(
            f"powersgd on Gloo: one bucket of {bucket_mb:g} MiB for the whole model (with "
            "several, its chained all-reduces reach Gloo in different orders on different ranks)"
        )
    ddp = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=bucket_mb)
    if name == "compute":
        ddp.register_comm_hook(None, _compute_hook)
    elif name == "ddp_fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "ddp_bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start_iter,
        )
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    elif name != "ddp":  # a registered method, its options after colons
        method, *texts = name.split(":")
        options = compressors.parse_options(method, texts)
        state = SparDLState(density=args.density, method=method, model=ddp, **options)
        ddp.register_comm_hook(state, spardl_hook)
    return ddp


def _last_gradient_clock(ddp) -> list:
    """A one-element list that holds when ``ddp``'s last parameter gradient was accumulated."""
    clock = [0.0]

    def mark(_):
        clock[0] = time.perf_counter()

    for parameter in ddp.parameters():
        parameter.register_post_accumulate_grad_hook(mark)
    return clock


def measure(args, hooks, note=print) -> tuple:
    """Run the interleaved iterations; return ``(times, exposed, threads)``.

    ``times`` and ``exposed`` are ``{hook: [seconds of each timed iteration]}``: the whole step,
    and the wait from the last gradient accumulated to backward's return (the synchronization
    left after compute). ``threads``: for the hooks of registered methods, ``{hook: {part:
    [seconds of each timed iteration]}}`` for each of :data:`THREAD_PARTS`. Every rank returns
    the same numbers: each iteration's are its slowest rank's. The models and their hooks are
    released before it returns (:func:`release`).
    """
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model, _, _ = synthetic_batch(args.model, 1, args.seed)
    _, inputs, labels = synthetic_batch(args.model, args.batch_size, args.seed + 1 + rank)
    runs = {}
    for name in hooks:
        ddp = wrap(name, model, args, note)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        runs[name] = (ddp, optimizer, _last_gradient_clock(ddp))
    del ddp, optimizer
    times, exposed, threads = _iterate(args, runs, inputs, labels)
    release(runs)
    parts = [times, exposed] + [{n: threads[n][p] for n in threads} for p in THREAD_PARTS]
    zeros = [0.0] * args.iters  # (hooks without a communication thread)
    table = torch.tensor(
        [[part.get(n, zeros) for n in hooks] for part in parts], dtype=torch.float64
    )
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    times, exposed, *shares = (
        {name: table[part, i].tolist() for i, name in enumerate(hooks)}
        for part in range(len(parts))
    )
    threads = {n: {p: s[n] for p, s in zip(THREAD_PARTS, shares)} for n in threads}
    return times, exposed, threads


def _iterate(args, runs: dict, inputs, labels) -> tuple:
    """The warm-up and timed iterations of every run in turn.

    Returns this rank's ``(times, exposed, threads)`` (as :func:`measure`'s).
    """
    times = {name: [] for name in runs}
    exposed = {name: [] for name in runs}
    states = {name: _state(ddp) for name, (ddp, _, _) in runs.items()}
    threads = {n: {p: [] for p in THREAD_PARTS} for n, s in states.items() if s is not None}
    for iteration in range(args.warmup + args.iters):
        for name, (ddp, optimizer, clock) in runs.items():
            dist.barrier()
            started = time.perf_counter()
            optimizer.zero_grad()
            output = ddp(inputs)
            loss = functional.cross_entropy(output.flatten(0, -2), labels.flatten())
            loss.backward()
            waited = time.perf_counter() - clock[0]
            optimizer.step()
            if iteration >= args.warmup:
                times[name].append(time.perf_counter() - started)
                exposed[name].append(waited)
            if states[name] is not None:
                stats = states[name].take_stats()  # this step's buckets (and resets)
                if iteration >= args.warmup:
                    shares = stats["thread_seconds"], stats["cpu_seconds"], stats["seconds"]["comm"]
                    for part, seconds in zip(THREAD_PARTS, shares):
                        threads[name][part].append(seconds)
    return times, exposed, threads


def _state(ddp):
    """The :class:`compressors.ddp.SparDLState` of ``ddp``'s hook; ``None`` for other hooks."""
    from compressors.ddp import SparDLState

    return next((s for _, s in getattr(ddp, "_comm_hooks", []) if isinstance(s, SparDLState)), None)


def release(runs: dict) -> None:
    """Finish and free the runs' DDP models, optimizers and hooks, in order; empties ``runs``.

    Every registered method's pipeline is waited for, the communication thread that ran its
    buckets (a daemon thread) is ended and joined, and the models (with their reducers, hooks
    and states, which hold the process group) are collected now, on this thread. Left running,
    that thread could still be in torch's C++ code, finishing its last bucket, when Python
    exits; Python ends such a thread by unwinding it, which aborts the process ("terminate
    called without an active exception").
    """
    states = [state for ddp, _, _ in runs.values() if (state := _state(ddp)) is not None]
    for state in states:
        state.pipeline.close()
    del states
    runs.clear()
    gc.collect()


def summarize(times: dict, exposed: dict = None, threads: dict = None) -> list:
    """Rows ``{hook, median_s, min_s, max_s, ratio, exposed_s}``, and :data:`THREAD_PARTS`.

    ratio: the median over ``compute``'s (None without it); exposed_s: the median of
    ``exposed`` (None without it); each of :data:`THREAD_PARTS`: the median of ``threads``'
    (None for a hook it lacks).
    """
    threads = threads or {}
    base = statistics.median(times["compute"]) if "compute" in times else None
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append(
            {
                "hook": name,
                "median_s": median,
                "min_s": min(values),
                "max_s": max(values),
                "ratio": median / base if base else None,
                "exposed_s": statistics.median(exposed[name]) if exposed else None,
                **{
                    part: statistics.median(threads[name][part]) if name in threads else None
                    for part in THREAD_PARTS
                },
            }
        )
    return rows


def format_table(rows: list) -> str:
    """A markdown table of :func:`summarize`'s rows."""
    lines = [
        "| hook | median s/iter | min | max | exposed s | ratio to compute "
        "| thread s | CPU s | transport s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        seconds = [
            "-" if row.get(key) is None else f"{row[key]:.3f}"
            for key in ("exposed_s", *THREAD_PARTS)
        ]
        lines.append(
            f"| {row['hook']} | {row['median_s']:.3f} | {row['min_s']:.3f} | "
            f"{row['max_s']:.3f} | {seconds[0]} | {ratio} | " + " | ".join(seconds[1:]) + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of ``scripts/ddp_compare.py``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    hooks = check(args, parser)
    if "RANK" not in os.environ:
        parser.error("run it under torchrun (e.g. torchrun --standalone --nproc-per-node 4 ...)")
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    def note(message):
        if rank == 0:
            print(f"ddp_compare.py: note: {message}", file=sys.stderr, flush=True)

    try:
        times, exposed, threads = measure(args, hooks, note)
    except Exception as error:  # noqa: BLE001 - one line, not a traceback from every rank
        print(f"ddp_compare.py: rank {rank}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    rows = summarize(times, exposed, threads)
    if rank == 0:
        setting = {
            "model": args.model,
            "ranks": size,
            "batch_size": args.batch_size,
            "density": args.density,
            "bucket_mb": args.bucket_mb,
            "iters": args.iters,
            "warmup": args.warmup,
            "powersgd_rank": args.powersgd_rank,
            "powersgd_start_iter": args.powersgd_start_iter,
            "network": os.environ.get("SPARDL_NETWORK_RATE", "loopback"),
        }
        print(
            f"{args.model}, {size} ranks, batch {args.batch_size}, density {args.density:g}, "
            f"network {setting['network']}; median of {args.iters} interleaved iterations "
            f"after {args.warmup} warm-up"
        )
        print(format_table(rows), flush=True)
        if args.json:
            with open(args.json, "w") as stream:
                json.dump(
                    {
                        "setting": setting,
                        "rows": rows,
                        "times": times,
                        "exposed": exposed,
                        "threads": threads,
                    },
                    stream,
                    indent=1,
                )
    dist.barrier()  # every rank is done with the group before it goes
    dist.destroy_process_group()
    gc.collect()
    return 0
