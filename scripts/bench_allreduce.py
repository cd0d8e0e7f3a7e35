#!/usr/bin/env python
"""Time every synchronization method side by side on the same gradients (CONTRACT section 4).

    scripts/run_bench.sh -n 4 --numel 14728266 --density 0.01 --json bench.json
    # the same as: OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1 \
    #              .venv/bin/mpiexec -n 4 .venv/bin/python scripts/bench_allreduce.py ...

Every method (default: all of ``compressors.available()``) synchronizes the same gradients: call
``c`` of rank ``r`` gets ``synthetic_gradient(scale, seed, r, c)`` (heavy tailed, see
:class:`SyntheticGradients`), or with ``--gradient model:NAME`` a real gradient of that model on a
random batch. Per call and rank the script records the wall time of ``sync.allreduce``, its phase
split from ``sync.stats``, the traffic and the cosine between the result and the exact average of
the raw gradients of that call (one exact MPI all-reduce, outside the timing). A call takes as long
as its slowest rank, so every time is that of the call's slowest rank, and so is its split into
phases; the table shows the median over the timed calls (warm-up calls excluded) and the min and
max.

The methods run interleaved: call c of every row synchronizes the same gradient, one row after
another, starting with a different row each call, so drift of the machine's speed during the run
hits all rows alike (``--sequential`` times one method after another, with one method's buffers in
memory at a time).

The **floor** row replays SparDL's messages (same sizes, partners and rounds, with d = 1) through
the transport with no selection, packing or accumulation, plus one ``Selector.topk`` pass over the
n gradient entries of this rank; ``x floor`` is each method's median over the floor's median.
The **floor+ef** row adds to it the error-feedback work that every method with a residual and a
dense result does, whatever it exchanges: its selection pass also adds the gradient into a
residual kept across calls (as SparDL's cuts do), and the call zeroes the result, writes the k
chosen values / P into it and zeroes them in the residual; ``x ef`` is the ratio to its median.

``--replay P`` (no mpiexec) measures one rank's work alone, free of the network and of other ranks
competing for the cores and memory: every row's call number ``--warmup`` is recorded on P
in-process ranks (``comm.recording``), then rank 0's share of it is timed in this process, its
received messages played back, its state restored before each call, and its result checked
against the recorded one. Set ``OMP_NUM_THREADS=1`` to time one rank per core.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_allreduce.py --replay 4 --numel 14728266 --density 0.01
"""
from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import compressors  # noqa: E402
from comm import local_group  # noqa: E402
from comm.recording import RecordingTransport, ReplayTransport  # noqa: E402
from compressors.sparse_ops import budget, put_, zero_  # noqa: E402

FLOOR = "floor"
EF_FLOOR = "floor+ef"
FLOORS = {FLOOR: False, EF_FLOOR: True}  # the last rows, after the methods': error feedback?
FLOOR_RUNS = [(label, label, {}) for label in FLOORS]
PHASES = ("select", "comm", "accumulate")


class SyntheticGradients:
    """Seeded heavy-tailed gradients: ``g[c, r] = scale * N(0, 1)``.

    ``scale`` is one log-normal magnitude per coordinate (``exp(0.8 z)``), shared by every rank
    and call, so, as in real training, the same coordinates tend to be large everywhere while
    the values differ per rank and call. The marginal is a normal/log-normal mixture (heavy
    tailed); each call costs one ``randn`` of length n.
    """

    def __init__(self, numel: int, seed: int) -> None:
        self.numel = numel
        self.seed = seed
        generator = torch.Generator().manual_seed(_mix(seed, -1, -1))
        self.scale = torch.randn(numel, generator=generator).mul_(0.8).exp_()

    def get(self, rank: int, call: int) -> torch.Tensor:
        """The gradient of ``rank`` at call ``call`` (float32, length ``numel``)."""
        generator = torch.Generator().manual_seed(_mix(self.seed, rank, call))
        return torch.randn(self.numel, generator=generator).mul_(self.scale)


class ModelGradients:
    """Real gradients: the cross-entropy gradient of model ``name`` (weights seeded by ``seed``,
    the same on every rank) on a random batch seeded by (seed, rank, call). One forward and
    backward pass per call: cheap for small models, seconds for VGG-16 on a CPU."""

    def __init__(self, name: str, seed: int, batch: int, input_shape: tuple, classes: int) -> None:
        import models
        if batch < 1 or classes < 2:
            raise ValueError(f"model gradients need --batch >= 1 and --classes >= 2, got {batch} and {classes}")
        torch.manual_seed(seed)
        self.model = models.create(name, classes, input_shape)
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.seed, self.batch, self.input_shape, self.classes = seed, batch, input_shape, classes
        try:  # a shape too small for the network fails here, not in the first timed call
            with torch.no_grad():
                self.model(torch.zeros(min(batch, 2), *input_shape))
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"model {name!r} does not take inputs of shape {','.join(map(str, input_shape))} "
                             f"(--input-shape): {str(error).splitlines()[0]}") from None

    def get(self, rank: int, call: int) -> torch.Tensor:
        """The flattened gradient of ``rank`` at call ``call``."""
        generator = torch.Generator().manual_seed(_mix(self.seed, rank, call))
        images = torch.randn(self.batch, *self.input_shape, generator=generator)
        labels = torch.randint(0, self.classes, (self.batch,), generator=generator)
        self.model.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(self.model(images), labels).backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).float()


def _mix(seed: int, rank: int, call: int) -> int:
    """A 63-bit generator seed from (seed, rank, call); distinct tuples give unrelated streams."""
    return int(np.random.SeedSequence([seed, rank + 1, call + 1]).generate_state(2, np.uint64)[0] >> 1)


def method_runs(methods: list, teams: list, workers: int) -> list:
    """``(label, name, options)`` for every row: each method once, spardl once per team count
    that divides ``workers`` (labelled ``spardl(d=2)`` etc. for d > 1)."""
    runs = []
    for name in methods:
        if name != "spardl":
            runs.append((name, name, {}))
            continue
        for d in teams:
            if workers % d == 0:
                runs.append(("spardl" if d == 1 else f"spardl(d={d})", name, {"teams": d}))
    return runs


class MethodRun:
    """One row's synchronizer on this rank, timed one call at a time."""

    def __init__(self, transport, name: str, options: dict, numel: int, density: float) -> None:
        self.sync = compressors.create(name, transport, numel=numel, density=density, **options)

    def restore(self, state: dict) -> None:
        """Go back to the synchronizer's ``state_dict`` ``state``."""
        self.sync.load_state_dict(state)

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One synchronization of ``grad``: the wall time and phase times in seconds, traffic,
        nnz, the cosine to ``exact`` and, when the method reports it, ``lost_mass``."""
        self.sync.transport.barrier()
        start = time.perf_counter()
        result = self.sync.allreduce(grad, out=out)
        seconds = time.perf_counter() - start
        stats = self.sync.stats
        record = {"seconds": seconds, **{p: stats["seconds"].get(p, 0.0) for p in PHASES},
                  "bytes": stats["bytes_sent"], "messages": stats["messages"],
                  "rounds": stats["rounds"], "nnz": stats["nnz"], "cosine": cosine(result, exact)}
        if "lost_mass" in stats:
            record["lost_mass"] = float(stats["lost_mass"])
        return record


class FloorRun:
    """The floor: SparDL's messages (``events``, as a :class:`RecordingTransport` logs them)
    replayed through ``transport`` with no method work, after one exact top-k selection over
    this rank's n entries (under a key, as the methods' selections are: from the thresholds
    remembered from the last call).

    ``error_feedback``: the ``floor+ef`` row (module docstring): the selection is from a
    residual kept across calls plus the gradient, added in the same pass, and the call writes
    the dense result into ``out``.
    """

    def __init__(self, transport, events: list, numel: int, density: float,
                 error_feedback: bool = False) -> None:
        self.transport = transport
        self.events = events
        self.selector = compressors.Selector()
        self.k = budget(numel, density)
        self.residual = torch.zeros(numel) if error_feedback else None
        self.sends = [(e, torch.zeros(e.nbytes // torch.empty((), dtype=e.dtype).element_size(), dtype=e.dtype))
                      for e in self.events if e.kind == "send"]
        self.rounds = max([e.round + e.rounds for e in self.events], default=0)

    def local_work(self, grad: torch.Tensor, out: torch.Tensor) -> tuple:
        """This rank's work besides the messages; its seconds of selection and of accumulation."""
        start = time.perf_counter()
        if self.residual is None:
            self.selector.topk(grad, self.k, key="gradient")
            return time.perf_counter() - start, 0.0
        columns, values = self.selector.select(self.residual, self.k, grad, key="residual")
        selected = time.perf_counter()
        put_(zero_(out), columns, values / self.transport.size)
        put_(self.residual, columns, 0.0)
        return selected - start, time.perf_counter() - selected

    def state(self):
        """What carries across calls and :meth:`restore` takes (the residual, or ``None``)."""
        return None if self.residual is None else self.residual.clone()

    def restore(self, state) -> None:
        """Go back to a :meth:`state`."""
        if state is not None:
            self.residual.copy_(state)

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One replay after the local work on ``grad``; a record like :meth:`MethodRun.time`."""
        self.transport.barrier()
        start = time.perf_counter()
        select, accumulate = self.local_work(grad, out)
        sent = time.perf_counter()
        for number in range(self.rounds):
            handles = [self.transport.isend(buffer, e.peer, number)
                       for e, buffer in self.sends if e.round == number]
            for e in self.events:
                if e.kind == "recv" and e.round == number:
                    self.transport.recv(e.peer, number, e.dtype, grad.device)
            self.transport.waitall(handles)
        end = time.perf_counter()
        return {"seconds": end - start, "select": select, "comm": end - sent, "accumulate": accumulate,
                "bytes": sum(e.nbytes for e, _ in self.sends), "messages": len(self.sends),
                "rounds": self.rounds, "nnz": self.k, "cosine": None}


def spardl_events(transport, source, density: float) -> list:
    """The messages of one SparDL call (d = 1) on a fresh synchronizer, as the floor replays them."""
    recorder = RecordingTransport(transport)
    compressors.create("spardl", recorder, numel=source.numel, density=density).allreduce(
        source.get(transport.rank, 0))
    return recorder.take()


class Replayed:
    """A :class:`MethodRun` or :class:`FloorRun` on a :class:`ReplayTransport`, started over
    before every call: the transport rewound and the run's state as before the recorded call
    (``state``: a synchronizer's ``state_dict``, a floor's :meth:`FloorRun.state`); a method's
    result must equal the recorded one (``result``)."""

    def __init__(self, run, transport: ReplayTransport, state=None, result: torch.Tensor = None) -> None:
        self.run, self.transport, self.state, self.result = run, transport, state, result

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One replayed call; raises ``RuntimeError`` if it does not repeat the recorded one."""
        self.transport.rewind()
        self.run.restore(self.state)
        record = self.run.time(grad, exact, out)
        if self.result is not None and not torch.equal(out, self.result):
            raise RuntimeError(f"the replay of {self.run.sync.name} differs from the recorded call")
        return record


def record_call(name: str, options: dict, grads: list, density: float) -> tuple:
    """Run ``name`` on ``len(grads[0])`` in-process ranks, ``grads[c][r]`` being rank r's
    gradient at call c, and record rank 0's last call: its state before that call, its events
    (with payloads) and its result."""

    def body(transport):
        recorder = RecordingTransport(transport, keep_payloads=True)
        sync = compressors.create(name, recorder, numel=grads[0][0].numel(), density=density, **options)
        for call in grads[:-1]:
            sync.allreduce(call[transport.rank])
        recorder.take()
        state = sync.state_dict()
        result = sync.allreduce(grads[-1][transport.rank])
        return (state, recorder.take(), result) if transport.rank == 0 else None

    return local_group(len(grads[0])).run(body)[0]


def replay_runs(runs: list, source, args) -> tuple:
    """``(factories, gradient)`` for :func:`time_runs` with ``--replay P``: each row's call
    number ``--warmup`` recorded on P in-process ranks, then replayed as rank 0 alone; the floors
    replay SparDL's (d = 1) messages of that call, floor+ef from the residual its local work left
    after the calls before."""
    workers = args.replay
    grads = [[source.get(rank, call) for rank in range(workers)] for call in range(args.warmup + 1)]
    exact = torch.stack(grads[-1]).mean(0)

    def method(name: str, options: dict) -> Replayed:
        state, events, result = record_call(name, options, grads, args.density)
        transport = ReplayTransport(events, 0, workers)
        return Replayed(MethodRun(transport, name, options, source.numel, args.density), transport, state, result)

    spardl_call = functools.cache(lambda: record_call("spardl", {}, grads, args.density)[1])

    def floor(error_feedback: bool) -> Replayed:
        events = spardl_call()
        transport = ReplayTransport(events, 0, workers)
        run = FloorRun(transport, events, source.numel, args.density, error_feedback)
        scratch = torch.empty(source.numel)
        for call in grads[:-1]:
            run.local_work(call[0], scratch)
        return Replayed(run, transport, run.state())

    # Each row is recorded when it is built: with --sequential one row's recording at a time.
    factories = [lambda name=name, options=options: method(name, options) for _, name, options in runs]
    factories += [lambda feedback=feedback: floor(feedback) for feedback in FLOORS.values()]
    return factories, lambda call: (grads[-1][0], exact)


def time_runs(factories: list, gradient, calls: int, sequential: bool) -> list:
    """Per-call records of every run (``factories``: functions that build a :class:`MethodRun`,
    :class:`FloorRun` or :class:`Replayed`), in the order of ``factories``; ``gradient(call)``
    gives this rank's gradient of call ``call`` and the exact average.

    Interleaved (the default): call c of every run synchronizes the same gradient one after
    another, starting at a different run each call, so a machine that drifts in speed during
    the benchmark slows every run alike. ``sequential``: all calls of one run, then the next
    (one run's buffers in memory at a time).
    """
    out = torch.empty(gradient(0)[0].numel())
    records = [[] for _ in factories]
    if sequential:
        for index, factory in enumerate(factories):
            run = factory()
            records[index] = [run.time(*gradient(call), out) for call in range(calls)]
            del run
        return records
    runs = [factory() for factory in factories]
    for call in range(calls):
        for index in [(call + shift) % len(runs) for shift in range(len(runs))]:
            records[index].append(runs[index].time(*gradient(call), out))
    return records


def mpi_gradients(comm, source):
    """``gradient(call)`` for :func:`time_runs` under MPI: this rank's gradient of the call and
    the exact average over the ranks (one MPI all-reduce per call, cached for the rows)."""
    from mpi4py import MPI
    cache = {}

    def gradient(call: int) -> tuple:
        if call not in cache:
            cache.clear()
            grad = source.get(comm.Get_rank(), call)
            exact = grad.clone()
            comm.Allreduce(MPI.IN_PLACE, exact.numpy(), op=MPI.SUM)
            cache[call] = grad, exact.div_(comm.Get_size())
        return cache[call]

    return gradient


def cosine(result: torch.Tensor, exact: torch.Tensor) -> float:
    """Cosine similarity of two vectors, computed in float64: 1.0 when both are zero, 0.0 when
    only one is, NaN when either holds NaN or inf."""
    a, b = result.double(), exact.double()
    norm_a, norm_b = float(a.norm()), float(b.norm())
    if norm_a == 0 or norm_b == 0:
        return float(norm_a == norm_b)
    return float(a.dot(b)) / (norm_a * norm_b)


def summarize_counts(per_rank: list) -> dict:
    """Traffic and nnz over the timed calls; ``per_rank[r][c]`` is rank r's record of call c.

    ``bytes_per_rank`` and ``messages`` are means over calls and ranks, ``bytes_max_rank`` the
    mean over calls of the busiest rank, ``rounds`` the most any rank counted in any call, and
    ``nnz`` the median over calls (rank 0's; results are identical on all ranks).
    """
    calls = range(len(per_rank[0]))
    workers = len(per_rank)
    return {
        "bytes_per_rank": statistics.fmean(sum(r[c]["bytes"] for r in per_rank) / workers for c in calls),
        "bytes_max_rank": statistics.fmean(max(r[c]["bytes"] for r in per_rank) for c in calls),
        "messages": statistics.fmean(sum(r[c]["messages"] for r in per_rank) / workers for c in calls),
        "rounds": max(r[c]["rounds"] for r in per_rank for c in calls),
        "nnz": statistics.median_low(per_rank[0][c]["nnz"] for c in calls),
    }


def summarize(label: str, name: str, options: dict, per_rank: list, args, workers: int, numel: int) -> dict:
    """One table/JSON row from every rank's timed records (see the module docstring)."""
    calls = range(len(per_rank[0]))
    # Per call, the record of its slowest rank: its time is the call's, and its phases split it.
    critical = [max((r[c] for r in per_rank), key=lambda record: record["seconds"]) for c in calls]
    slowest = [record["seconds"] * 1e3 for record in critical]
    q1, _, q3 = statistics.quantiles(slowest, n=4) if len(slowest) > 1 else (slowest[0],) * 3
    row = {"method": name, "label": label, "teams": options.get("teams", 1), "workers": workers,
           "numel": numel, "density": args.density, "median_ms": statistics.median(slowest),
           "min_ms": min(slowest), "max_ms": max(slowest), "q1_ms": q1, "q3_ms": q3}
    for phase in PHASES:
        row[f"{phase}_ms"] = statistics.median(record[phase] * 1e3 for record in critical)
    row.update(summarize_counts(per_rank))
    cosines = [per_rank[0][c]["cosine"] for c in calls]
    if cosines[0] is not None:  # a NaN (non-finite result) shows, instead of sorting at random
        cosines = [float("nan")] if np.isnan(cosines).any() else cosines
    row["cosine"] = None if cosines[0] is None else statistics.median(cosines)
    if "lost_mass" in per_rank[0][0]:
        row["lost_mass"] = statistics.fmean(r[c]["lost_mass"] for r in per_rank for c in calls)
    row.update(iters=args.iters, warmup=args.warmup, seed=args.seed, gradient=args.gradient, replay=args.replay)
    return row


def format_table(rows: list) -> str:
    """The rows as an aligned text table, with each method's ratios to the two floor rows
    (``floor_ratio``, ``ef_floor_ratio``)."""
    header = (f"{'method':<14}{'P':>4}{'median ms':>11}{'min-max ms':>17}{'select':>9}{'comm':>9}"
              f"{'accum':>9}{'MB/rank':>9}{'msgs':>7}{'rounds':>7}{'nnz':>10}{'cosine':>9}{'x floor':>8}"
              f"{'x ef':>7}")
    lines = [header, "-" * len(header)]
    for r in rows:
        spread = f"{r['min_ms']:.1f}-{r['max_ms']:.1f}"
        cos = "-" if r["cosine"] is None else f"{r['cosine']:.4f}"
        ratios = [f"{r[key]:.2f}" for key in ("floor_ratio", "ef_floor_ratio")]
        lines.append(f"{r['label']:<14}{r['workers']:>4}{r['median_ms']:>11.1f}{spread:>17}"
                     f"{r['select_ms']:>9.1f}{r['comm_ms']:>9.1f}{r['accumulate_ms']:>9.1f}"
                     f"{r['bytes_per_rank'] / 1e6:>9.3f}{r['messages']:>7.1f}{r['rounds']:>7}"
                     f"{r['nnz']:>10}{cos:>9}{ratios[0]:>8}{ratios[1]:>7}")
    return "\n".join(lines)


def write_csv(rows: list, path: str) -> None:
    """The rows as CSV, one column per key of any row."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list, path: str) -> None:
    """Bar charts: median time split by phase (with min-max whiskers) and bytes per rank."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [r["label"] for r in rows]
    x = np.arange(len(rows))
    fig, (times, traffic) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(rows), 4.5))
    bottom = np.zeros(len(rows))
    for phase in PHASES:
        heights = np.array([r[f"{phase}_ms"] for r in rows])
        times.bar(x, heights, bottom=bottom, label=phase)
        bottom += heights
    medians = np.array([r["median_ms"] for r in rows])
    spread = [medians - [r["min_ms"] for r in rows], [r["max_ms"] for r in rows] - medians]
    times.errorbar(x, medians, yerr=spread, fmt="k_", capsize=4, label="median (min-max)")
    times.set_ylabel("ms per call (slowest rank)")
    times.legend(fontsize=8)
    traffic.bar(x, [r["bytes_per_rank"] / 1e6 for r in rows], color="tab:gray")
    traffic.set_ylabel("MB sent per rank")
    first = rows[0]
    for axis in (times, traffic):
        axis.set_xticks(x, labels, rotation=30, ha="right")
    fig.suptitle(f"P={first['workers']}, n={first['numel']:,}, density={first['density']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def launched_rank_and_size() -> tuple:
    """This process's rank and the job's size as mpiexec (MPICH's Hydra or Open MPI) gave them in
    the environment, readable before MPI starts; ``(0, 1)`` without a launcher."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


class RankZeroParser(argparse.ArgumentParser):
    """An argument parser that prints (help, usage errors) from the first rank only: under
    mpiexec every rank parses the same command line and exits alike, and one copy is enough."""

    def _print_message(self, message, file=None):
        if launched_rank_and_size()[0] == 0:
            super()._print_message(message, file)


def usage_checked(parser: argparse.ArgumentParser, check, *values):
    """``check(*values)``, a ``ValueError`` turned into the parser's usage error (exit status 2)."""
    try:
        return check(*values)
    except ValueError as error:
        parser.error(str(error))


def method_names(text: str) -> list:
    """The registry names of ``--methods`` (``all``, or names and aliases, comma-separated),
    repeats dropped; ``ValueError`` naming the valid ones for an unknown name."""
    names = compressors.available() if text == "all" else text.split(",")
    return list(dict.fromkeys(compressors.resolve(name).name for name in names))


def positive_ints(text: str, flag: str) -> list:
    """The comma-separated integers >= 1 of ``flag``, repeats dropped; ``ValueError`` otherwise."""
    try:
        values = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} takes integers >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def output_file(path: str, flag: str) -> str:
    """``path`` if a file can be written there; ``ValueError`` (checked before a long run, not
    after it) when its directory is missing or not writable, or the path is a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory")
    if not os.path.isdir(directory):
        raise ValueError(f"{flag} {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")
    return path


def plot_file(path: str) -> str:
    """``--plot``'s :func:`output_file`, and ``ValueError`` unless the name ends in a format
    matplotlib writes (checked before a long run: it would fail only when the plot is saved)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    formats = FigureCanvasAgg.get_supported_filetypes()
    if os.path.splitext(path)[1].lstrip(".").lower() not in formats:
        raise ValueError(f"--plot {path}: the name must end in an image format: "
                         f"{', '.join('.' + name for name in sorted(formats))}")
    return output_file(path, "--plot")


def check_seed(seed: int) -> int:
    """``seed`` if it is >= 0 (NumPy's seeds are), else ``ValueError``."""
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    return seed


def warn_skipped_teams(methods: list, teams: list, workers: int) -> None:
    """Say on stderr which ``teams`` :func:`method_runs` leaves out at P = ``workers``."""
    skipped = [d for d in teams if workers % d] if "spardl" in methods else []
    if skipped:
        print(f"note: --teams {','.join(map(str, skipped))} skipped: a team count must divide "
              f"P = {workers}", file=sys.stderr)


def runs_to_time(args, workers: int, speaks: bool) -> list:
    """:func:`method_runs` at P = ``workers``, the skipped team counts said on stderr if
    ``speaks``; exit status 2 when no method is left to time."""
    if speaks:
        warn_skipped_teams(args.methods, args.teams, workers)
    runs = method_runs(args.methods, args.teams, workers)
    if not runs:
        if speaks:
            print(f"bench_allreduce.py: nothing to time at P = {workers} (see the note above)", file=sys.stderr)
        sys.exit(2)
    return runs


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring and the README's "Benchmarks, simulator,
    reports")."""
    parser = RankZeroParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Two reference rows follow the methods: 'floor' (SparDL's messages with no method work,\n"
               "plus one top-k pass over n) and 'floor+ef' (the floor plus the error-feedback work of a\n"
               "method with a residual and a dense result); 'x floor' and 'x ef' are each row's median\n"
               "over theirs. Under mpiexec, use scripts/run_bench.sh -n P, which sets one thread per\n"
               "rank and MPICH's yield variables.")
    default = " (default: %(default)s)"
    parser.add_argument("--numel", type=int, default=1 << 20, help="gradient length n, synthetic" + default)
    parser.add_argument("--density", type=float, default=0.01, help="fraction of entries kept, in (0, 1]" + default)
    parser.add_argument("--methods", default="all", help="comma-separated names, or 'all' (the default)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per method" + default)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per method first" + default)
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradients and model weights" + default)
    parser.add_argument("--teams", default="1", help="spardl team counts d, comma-separated" + default)
    parser.add_argument("--gradient", default="synthetic", help="'synthetic' (the default) or 'model:NAME'")
    parser.add_argument("--batch", type=int, default=8, help="batch size for model gradients" + default)
    parser.add_argument("--input-shape", default="3,32,32", help="C,H,W for model gradients" + default)
    parser.add_argument("--classes", type=int, default=10, help="classes for model gradients" + default)
    parser.add_argument("--sequential", action="store_true",
                        help="time all calls of one method before the next (less memory: one "
                             "method's buffers at a time) instead of interleaving the methods call "
                             "by call (the default: drift of the machine's speed hits all alike)")
    parser.add_argument("--replay", type=int, metavar="P",
                        help="no mpiexec: record each method's call on P in-process ranks and time "
                             "rank 0's share of it alone in this process, its messages played back "
                             "(the compute cost per rank, free of network and oversubscription)")
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="FILE",
                        help="write a chart of times and bytes (FILE.png; or .pdf, .svg, ...)")
    args = parser.parse_args(argv)
    args.methods = usage_checked(parser, method_names, args.methods)
    args.teams = usage_checked(parser, positive_ints, args.teams, "--teams")
    usage_checked(parser, compressors.base.check_density, args.density)
    if args.iters < 1 or args.warmup < 0 or args.numel < 1 or (args.replay is not None and args.replay < 1):
        parser.error("--iters must be >= 1, --warmup >= 0, --numel >= 1, --replay >= 1")
    if args.replay and launched_rank_and_size()[1] > 1:
        parser.error("--replay times one process alone: start it without mpiexec")
    usage_checked(parser, check_seed, args.seed)
    for flag in ("json", "csv"):
        if getattr(args, flag):
            usage_checked(parser, output_file, getattr(args, flag), f"--{flag}")
    if args.plot:
        usage_checked(parser, plot_file, args.plot)
    args.source = usage_checked(parser, gradient_source, args)
    return args


def gradient_source(args):
    """The gradients every method synchronizes (``--gradient``); ``ValueError`` for options
    that cannot make them."""
    if args.gradient == "synthetic":
        return SyntheticGradients(args.numel, args.seed)
    kind, _, name = args.gradient.partition(":")
    if kind != "model" or not name:
        raise ValueError(f"--gradient must be 'synthetic' or 'model:NAME', got {args.gradient!r}")
    parts = args.input_shape.split(",")
    if len(parts) != 3 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
        raise ValueError(f"--input-shape takes three integers >= 1, C,H,W, got {args.input_shape!r}")
    return ModelGradients(name, args.seed, args.batch, tuple(map(int, parts)), args.classes)


def mpi_rows(args) -> list:
    """Time every row under MPI on ``MPI.COMM_WORLD``; the rows on rank 0, [] elsewhere."""
    from mpi4py import MPI
    from comm.mpi import MPITransport, abort_on_uncaught_exception
    from trainer.distributed import place_rank
    abort_on_uncaught_exception()
    comm = MPI.COMM_WORLD
    place_rank(comm, "cpu")  # torch threads: this host's cores shared by its ranks, as in training
    source = args.source
    workers = comm.Get_size()
    runs = runs_to_time(args, workers, speaks=comm.Get_rank() == 0)
    factories = [lambda name=name, options=options: MethodRun(MPITransport(comm), name, options,
                                                              source.numel, args.density)
                 for _, name, options in runs]

    spardl_call = functools.cache(lambda: spardl_events(MPITransport(comm), source, args.density))

    def floor(error_feedback: bool) -> FloorRun:
        return FloorRun(MPITransport(comm), spardl_call(), source.numel, args.density, error_feedback)

    factories += [lambda feedback=feedback: floor(feedback) for feedback in FLOORS.values()]
    records = time_runs(factories, mpi_gradients(comm, source), args.warmup + args.iters, args.sequential)
    rows = []
    for (label, name, options), run_records in zip(runs + FLOOR_RUNS, records):
        per_rank = comm.gather(run_records[args.warmup:], root=0)
        if comm.Get_rank() == 0:
            rows.append(summarize(label, name, options, per_rank, args, workers, source.numel))
    return rows if comm.Get_rank() == 0 else []


def replay_rows(args) -> list:
    """Time every row's rank 0 alone in this process (``--replay P``, see the module docstring)."""
    source = args.source
    runs = runs_to_time(args, args.replay, speaks=True)
    factories, gradient = replay_runs(runs, source, args)
    records = time_runs(factories, gradient, args.warmup + args.iters, args.sequential)
    return [summarize(label, name, options, [run_records[args.warmup:]], args, args.replay, source.numel)
            for (label, name, options), run_records in zip(runs + FLOOR_RUNS, records)]


def main(argv=None) -> list:
    """Run the benchmark (under MPI, or replayed with ``--replay``); print and write the rows on
    rank 0 and return them ([] on other ranks)."""
    args = parse_args(argv)
    rows = replay_rows(args) if args.replay else mpi_rows(args)
    if not rows:
        return []
    medians = {row["method"]: row["median_ms"] for row in rows}
    for row in rows:
        row["floor_ratio"] = row["median_ms"] / medians[FLOOR]
        row["ef_floor_ratio"] = row["median_ms"] / medians[EF_FLOOR]
    if args.replay:
        print(f"rank 0 of a {args.replay}-rank call, replayed alone in one process "
              f"({torch.get_num_threads()} torch thread(s), no network, no other rank):")
    print(format_table(rows), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, args.plot)
    return rows


if __name__ == "__main__":
    main()
