#!/usr/bin/env python
"""Predict synchronization time at scale from the real methods run on the in-process group.

    .venv/bin/python scripts/simulate.py --workers 16,32,64,128,256 --plot sim.png --json sim.json

Every method runs for real on ``comm.local_group(P)`` (P threads of one process) on the
benchmark's heavy-tailed gradients (:class:`bench_allreduce.SyntheticGradients`), at a modest n
(``--numel``, 2^18 by default) so that data-dependent sizes (gtopk merges, oktopk regions, SAG
unions) are real. A :class:`comm.recording.RecordingTransport` logs every message with its round,
and a counter logs how many elements each rank hands to the selector: top-k selections
(``Selector.scan``, which ``topk``, ``topk_rows``, ``select`` and ``cut`` use; "hinted" when every
row started from the threshold the selector remembered from the last call) and threshold passes
(``Selector.above``, ``at_least``).

The model, per call; the prediction is the mean over the ``--calls`` calls after the warm-up,
with each kind of call at its share of the method's period (:func:`call_weights`): Ok-Topk's
exact calls (call 0, in the warm-up) weigh 1/32, its threshold-reusing calls the rest.

- simulated n: ``--numel`` rounded up to P*B entries with B*density at or just above a whole
  number (:func:`simulated_numel`; at density 0.01 at most 100*P more entries), so that SparDL's
  per-block budget max(1, int(B*density)) keeps the density's share as it does at the model's n;
  unrounded, n = 2^18 at P = 256 would keep 10 of 10.24 entries per block and flatter SparDL's
  traffic by 2.3% (and by 21% at n = 8192, P = 64).
- scale factor s = model_numel / n: bytes and scanned elements grow linearly with n; message
  and round counts do not. (Exact for fixed-size messages; an approximation where sizes depend on
  the data, and it ignores the few count words that lead variable-size messages.)
- network: the rounds run in lock step. Round i costs max(alpha, max over ranks w of
  msgs(w, i) * alpha + s * bytes(w, i) * beta), where msgs and bytes are what w sends in round i;
  the network time is the sum over rounds. Messages a method leaves out of its own traffic count
  (gtopk's lost-mass measurement) are left out here too. A dense all-reduce counted as R rounds (Rabenseifner,
  CONTRACT) is spread evenly over its R rounds, one message per round.
- selection: max over ranks of the summed time of that rank's selections, each one a vector of
  s times the recorded length (a matrix: its first row, then each further row at its own
  price), timed by :class:`SelectionCost`: ``Selector.topk`` and ``topk_rows`` (from the sample's
  estimate, and hinted: from remembered thresholds) and threshold passes
  (``Selector.at_least``) measured on this machine at several lengths with
  ``--select-threads`` threads (default 1: one core per worker, as in the benchmark; several
  threads on a shared machine measure noise), ``--select-device cuda`` measures them on a GPU
  instead; ``--select-rate`` fixes a throughput in elements/s.
- predicted time = network + selection. Packing, scatter-adds and copies are not modelled.

Presets: ``ethernet`` (10 Gb/s: alpha 25 us, beta 1/1.25e9 s/B) and ``infiniband`` (100 Gb/s:
alpha 1.5 us, beta 1/12.5e9 s/B); ``--alpha``/``--beta`` add a ``custom`` network.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_allreduce as bench  # noqa: E402  (puts the repository root on sys.path)
import compressors  # noqa: E402
from comm.local import LocalGroup, LocalTransport  # noqa: E402
from comm.recording import RecordingTransport  # noqa: E402
from compressors.selection import Selector  # noqa: E402

VGG16_NUMEL = 14_728_266


@dataclass(frozen=True)
class Network:
    """An alpha-beta network: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    name: str
    alpha: float
    beta: float


PRESETS = {"ethernet": Network("ethernet", 25e-6, 1 / 1.25e9),
           "infiniband": Network("infiniband", 1.5e-6, 1 / 12.5e9)}


class SharedSumGroup(LocalGroup):
    """The in-process group with an all-reduce that needs O(n) memory, not O(P^2 n).

    The stock in-process all-reduce copies every rank's tensor to every peer, which at P = 256
    does not fit in memory for the dense method. Here rank 0 sums the P tensors in rank order
    (the same bits on every rank) and every rank copies the sum. Traffic is counted as before.
    """

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.slots: list = [None] * size
        self.total = None

    def rank(self, rank: int) -> "SharedSumTransport":
        return SharedSumTransport(self, rank)


class SharedSumTransport(LocalTransport):
    """One rank of a :class:`SharedSumGroup`."""

    def _allreduce_sum(self, tensor):
        group = self.group
        group.slots[self.rank] = tensor
        self._barrier()
        if self.rank == 0:
            group.total = _ordered_sum(group.slots)
        self._barrier()
        tensor.copy_(group.total)
        self._barrier()  # nobody starts the next all-reduce before every rank has its copy
        return tensor


def _ordered_sum(tensors: list) -> torch.Tensor:
    """tensors[0] + tensors[1] + ... in that order, in a new tensor."""
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total


class SelectionCounter:
    """While active, logs the length of every vector each thread hands to a top-k selection
    (``Selector.scan``, which ``topk``, ``topk_rows``, ``select`` and ``cut`` go through: a matrix
    logs its first row as a ``topk`` and each further row as a ``topk_row``, or as ``hinted`` and
    ``hinted_row`` when the selector started every row from a remembered threshold) and to a
    threshold pass (``Selector.above``, ``at_least``). Nested calls are logged once."""

    KINDS = ("topk", "topk_row", "hinted", "hinted_row", "above")
    METHODS = {"scan": "topk", "above": "above", "at_least": "above"}

    def __init__(self) -> None:
        self._local = threading.local()
        self._originals = {}

    def __enter__(self) -> "SelectionCounter":
        for method, kind in self.METHODS.items():
            self._originals[method] = original = getattr(Selector, method)
            setattr(Selector, method, self._logged(kind, original))
        return self

    def __exit__(self, *exc) -> None:
        for method, original in self._originals.items():
            setattr(Selector, method, original)

    def take(self) -> dict:
        """This thread's vector lengths per kind since the last ``take``."""
        lengths = self._state().lengths
        self._local.lengths = {kind: [] for kind in self.KINDS}
        return lengths

    def _state(self):
        if not hasattr(self._local, "lengths"):
            self._local.lengths, self._local.depth = {kind: [] for kind in self.KINDS}, 0
        return self._local

    def _logged(self, kind: str, original):
        counter = self

        def wrapper(selector, x, *args, **kwargs):
            state = counter._state()
            state.depth += 1
            try:
                result = original(selector, x, *args, **kwargs)
            finally:
                state.depth -= 1
            if state.depth == 0 and kind == "above":
                state.lengths["above"].append(x.numel())
            elif state.depth == 0:  # a scan of an (r, n) matrix
                first = "hinted" if result is not None and result.hinted.all() else "topk"
                state.lengths[first].append(x.shape[1])
                state.lengths[first + "_row"] += [x.shape[1]] * (x.shape[0] - 1)
            return result

        return wrapper


class SelectionCost:
    """Seconds one selection of a vector of a given length takes on this machine.

    Measured at lengths 4^6 .. 4^12, best of ``repeats`` timings taken in turns
    (:func:`_time_selections`), each of enough calls to scan at least 2^22 entries (single
    short calls time mostly noise): ``topk`` is ``Selector.topk`` keeping density * length
    entries, ``above`` is ``Selector.at_least`` keeping about as many (the threshold pass of
    Ok-Topk and Gaussiank), ``topk_row`` is what each further row of a matrix adds to a
    ``Selector.topk_rows`` call (SparDL's cuts of several blocks at once; timed on a matrix of
    at least 2^23 entries, so that it comes from memory as the blocks do): short rows cost more
    per entry than one long vector. ``hinted`` and ``hinted_row`` are the same with a key, taking
    turns between two independent draws, so each call starts from thresholds remembered from
    other values, as from one gradient to the next (the rescans of rows whose remembered
    threshold misses are priced at the rate they occur at that length, not at the simulated n,
    where short rows keep few entries and miss more often). Other lengths are interpolated in
    log-log (constant rate beyond the ends). ``rate`` (elements/s) replaces the measurement by a
    fixed throughput (e.g. a GPU's).
    """

    LENGTHS = tuple(4 ** i for i in range(6, 13))

    def __init__(self, density: float, threads: int, rate: float | None = None, seed: int = 0,
                 repeats: int = 9, device: str = "cpu") -> None:
        self.lengths = np.array(self.LENGTHS, dtype=float)
        if rate is not None:
            self.seconds_at = {kind: self.lengths / rate for kind in SelectionCounter.KINDS}
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            self.seconds_at = _time_selections(density, seed, repeats, device)
        finally:
            torch.set_num_threads(previous)

    def seconds(self, kind: str, lengths) -> float:
        """Total seconds of selections of ``kind`` on vectors of ``lengths`` (any reals >= 1)."""
        lengths = np.asarray(lengths, dtype=float)
        if lengths.size == 0:
            return 0.0
        rates = self.lengths / self.seconds_at[kind]
        rate = np.exp(np.interp(np.log(lengths), np.log(self.lengths), np.log(rates)))
        return float((lengths / rate).sum())

    def rate(self, kind: str, length: int) -> float:
        """Elements per second of one selection of ``kind`` on a vector of ``length``."""
        return length / self.seconds(kind, [length])


def _selection_runs(numel: int, density: float, seed: int, device: str) -> dict:
    """Per kind (see :class:`SelectionCost`), a function that runs one selection on ``device``
    and the number of rows of length ``numel`` it selects from. The ``hinted`` kinds take turns
    between two independent draws under one key, so each starts from the other's thresholds."""
    rows = max(2, (1 << 23) // numel)
    x, other = (bench.SyntheticGradients(numel, seed).get(0, call).to(device) for call in (0, 1))
    matrices = [bench.SyntheticGradients(rows * numel, seed).get(0, call).to(device).view(rows, numel)
                for call in (0, 1)]
    k = max(1, int(numel * density))
    threshold = float(x.abs().kthvalue(max(1, numel - k)).values)
    selector = Selector()
    vectors, tables = itertools.cycle((x, other)), itertools.cycle(matrices)
    return {"topk": (lambda: selector.topk(x, k), 1), "above": (lambda: selector.at_least(x, threshold), 1),
            "topk_row": (lambda: selector.topk_rows(matrices[0], k), rows),
            "hinted": (lambda: selector.topk(next(vectors), k, key="vector"), 1),
            "hinted_row": (lambda: selector.topk_rows(next(tables), k, key="matrix"), rows)}


def _time_selections(density: float, seed: int, repeats: int, device: str) -> dict:
    """Best seconds of one selection per kind at each of :attr:`SelectionCost.LENGTHS`: the
    repeats take turns over all kinds and lengths, so that a burst of load on the machine spoils
    one timing of many rather than every timing of one. A ``topk_row`` is the matrix call's
    time less one ``topk``, per further row."""
    runs = {numel: _selection_runs(numel, density, seed, device) for numel in SelectionCost.LENGTHS}
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = {kind: np.full(len(runs), np.inf) for kind in SelectionCounter.KINDS}
    for repeat in range(repeats + 1):  # the first round warms up
        for place, (numel, by_kind) in enumerate(runs.items()):
            for kind, (run, rows) in by_kind.items():
                calls = max(1, (1 << 22) // (rows * numel))
                synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                synchronize()
                if repeat:
                    best[kind][place] = min(best[kind][place], (time.perf_counter() - start) / calls)
    rows = np.array([by_kind["topk_row"][1] for by_kind in runs.values()])
    for single in ("topk", "hinted"):
        further = best[single + "_row"] - best[single]
        best[single + "_row"] = np.maximum(further, 0.01 * best[single]) / (rows - 1)  # > 0 even in noise
    return best


def record_calls(name: str, options: dict, workers: int, numel: int, density: float, calls: int,
                 seed: int = 0, source=None, warmup: int = 0) -> list:
    """Run ``calls`` synchronizations of method ``name`` on an in-process group of ``workers``,
    the first ``warmup`` of them warm-up.

    Returns ``per_rank[r][c]``: rank r's record of call c with the keys the benchmark records
    (``bytes``, ``messages``, ``rounds``, ``nnz``) plus ``events`` (its logged messages),
    ``selections`` (the lengths of the vectors handed to the selector, per kind) and ``weight``
    (its weight in the mean over one period, :func:`call_weights`). Rank r's gradient at call c
    is ``source.get(r, c)``, by default the benchmark's synthetic gradients of ``seed``.
    """
    source = source or bench.SyntheticGradients(numel, seed)

    def body(transport, counter):
        recorder = RecordingTransport(transport)
        sync = compressors.create(name, recorder, numel=numel, density=density, **options)
        records = []
        for call, weight in enumerate(call_weights(sync, warmup, calls)):
            grad = source.get(transport.rank, call)
            counter.take()
            sync.allreduce(grad)
            stats = sync.stats
            records.append({"bytes": stats["bytes_sent"], "messages": stats["messages"],
                            "rounds": stats["rounds"], "nnz": stats["nnz"],
                            "events": recorder.take(), "selections": counter.take(), "weight": weight})
        return records

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with SelectionCounter() as counter:
            return SharedSumGroup(workers).run(body, counter)
    finally:
        torch.set_num_threads(threads)


def call_weights(sync, warmup: int, calls: int) -> list:
    """The weights of calls 0 .. ``calls``-1 of ``sync`` in the mean over one period of its call
    kinds (:meth:`Synchronizer.call_kind`), so that a method's periodic extra work (Ok-Topk's
    exact calls: 1 in 32) is priced at its share. Each kind's share of the period goes in equal
    parts to the calls of that kind after the ``warmup``, else to the warm-up calls of that
    kind, else to call 0 (which does all the periodic work: a slight over-estimate).
    """
    kinds = [sync.call_kind(step) for step in range(calls)]
    period = [sync.call_kind(step) for step in range(sync.kind_period)]
    weights = [0.0] * calls
    for kind in dict.fromkeys(period):
        holders = ([c for c in range(warmup, calls) if kinds[c] == kind]
                   or [c for c in range(min(warmup, calls)) if kinds[c] == kind] or [0])
        for call in holders:
            weights[call] += period.count(kind) / len(period) / len(holders)
    return weights


def predict_call(records: list, network: Network, scale: float, cost: SelectionCost) -> dict:
    """Predicted seconds of one call from every rank's record of it (model: module docstring)."""
    length = max(r["rounds"] for r in records)
    messages = np.zeros((len(records), length))
    sent = np.zeros((len(records), length))
    for rank, record in enumerate(records):
        for event in record["events"]:
            if event.round >= length:
                continue  # traffic the method does not count (gtopk's lost-mass measurement)
            if event.kind == "send":
                messages[rank, event.round] += 1
                sent[rank, event.round] += event.nbytes
            elif event.kind == "allreduce":
                span = slice(event.round, event.round + event.rounds)
                messages[rank, span] += 1
                sent[rank, span] += event.nbytes / event.rounds
    per_round = (messages * network.alpha + sent * scale * network.beta).max(axis=0, initial=0.0)
    net = float(np.maximum(per_round, network.alpha).sum())
    select = max(sum(cost.seconds(kind, np.multiply(lengths, scale)) for kind, lengths in r["selections"].items())
                 for r in records)
    return {"network": net, "select": select, "total": net + select}


def predict(per_rank: list, network: Network, scale: float, cost: SelectionCost) -> dict:
    """The mean of :func:`predict_call` over one period of call kinds (the records' ``weight``);
    ``per_rank[r][c]`` as :func:`record_calls` returns."""
    calls = [(predict_call([r[c] for r in per_rank], network, scale, cost), per_rank[0][c]["weight"])
             for c in range(len(per_rank[0])) if per_rank[0][c]["weight"]]
    return {key: sum(call[key] * weight for call, weight in calls) for key in calls[0][0]}


def simulated_numel(numel: int, workers: int, density: float) -> int:
    """``numel`` rounded up to ``workers * B`` where ``B * density`` is a whole number or a little
    more (less than 1/B of it): the smallest B >= ceil(numel / workers) whose block keeps
    ceil(ceil(numel / workers) * density) entries. Then every block of every team count keeps
    its share of the density, as the model's large blocks do (module docstring)."""
    kept = math.ceil(math.ceil(numel / workers) * density)
    return workers * math.ceil(kept / density)


def simulate_row(label: str, name: str, options: dict, workers: int, args, networks: list,
                 cost: SelectionCost) -> list:
    """Record one method at one P and return one row per network."""
    start = time.perf_counter()
    numel = simulated_numel(args.numel, workers, args.density)
    per_rank = record_calls(name, options, workers, numel, args.density,
                            args.warmup + args.calls, args.seed, warmup=args.warmup)
    print(f"  simulated {label} at P={workers}, n={numel:,} in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    timed = [records[args.warmup:] for records in per_rank]
    scale = args.model_numel / numel
    counts = bench.summarize_counts(timed)
    scanned = statistics.fmean(sum(record["weight"] * sum(map(sum, record["selections"].values()))
                                   for record in records) for records in per_rank)  # as predict weighs
    rows = []
    for network in networks:
        predicted = predict(per_rank, network, scale, cost)
        rows.append({"method": name, "label": label, "teams": options.get("teams", 1),
                     "workers": workers, "numel": numel, "model_numel": args.model_numel,
                     "density": args.density, "network": network.name, "alpha": network.alpha,
                     "beta": network.beta, "predicted_ms": predicted["total"] * 1e3,
                     "network_ms": predicted["network"] * 1e3, "select_ms": predicted["select"] * 1e3,
                     **counts, "model_bytes_per_rank": counts["bytes_per_rank"] * scale,
                     "scanned_per_rank": scanned, "calls": args.calls, "seed": args.seed})
    return rows


def describe(cost: SelectionCost, args) -> str:
    """One line on the selection throughput the model uses."""
    if args.select_rate is not None:
        return f"selection: fixed {args.select_rate / 1e6:g} M elements/s"
    parts = [f"{kind} " + ", ".join(f"{cost.rate(kind, n) / 1e6:.0f}" for n in (4 ** 8, 4 ** 10, 4 ** 12))
             for kind in SelectionCounter.KINDS]
    where = "a GPU" if args.select_device != "cpu" else f"this machine's CPU ({args.select_threads} threads)"
    return (f"selection on {where}, M elements/s at n = "
            f"65,536 / 1,048,576 / 16,777,216: {'; '.join(parts)}")


def format_tables(rows: list, key: str, title: str) -> str:
    """Per network: ``key`` (ms) per method (columns) and P (rows), and the fastest method."""
    out = []
    for network in dict.fromkeys(r["network"] for r in rows):
        subset = [r for r in rows if r["network"] == network]
        labels = list(dict.fromkeys(r["label"] for r in subset))
        first = subset[0]
        out.append(f"\n{network} (alpha {first['alpha'] * 1e6:g} us, beta {first['beta'] * 1e9:g} ns/B): "
                   f"{title}, n={first['model_numel']:,}, density {first['density']}")
        header = f"{'P':>5}" + "".join(f"{label:>14}" for label in labels) + "   fastest"
        out += [header, "-" * len(header)]
        for workers in sorted({r["workers"] for r in subset}):
            cells = {r["label"]: r[key] for r in subset if r["workers"] == workers}
            line = f"{workers:>5}" + "".join(f"{cells[l]:>14.2f}" if l in cells else f"{'-':>14}" for l in labels)
            out.append(line + f"   {min(cells, key=cells.get)}")
    return "\n".join(out)


def crossovers(rows: list, reference: str = "spardl") -> list:
    """Sentences saying, per network and other method, at which P the row labelled ``reference``
    is faster or slower (other option sets of its own method, such as team counts, are skipped)."""
    method_of = {r["label"]: r["method"] for r in rows}
    lines = []
    for network in dict.fromkeys(r["network"] for r in rows):
        times = {(r["label"], r["workers"]): r["predicted_ms"] for r in rows if r["network"] == network}
        for label in dict.fromkeys(l for l, _ in times):
            common = sorted(p for l, p in times if l == label and (reference, p) in times)
            if method_of[label] == method_of.get(reference) or not common:
                continue
            faster = [p for p in common if times[(reference, p)] < times[(label, p)]]
            slower = [p for p in common if p not in faster]
            switches = [f"{a}->{b}" for a, b in zip(common, common[1:]) if (a in faster) != (b in faster)]
            lines.append(f"{network}: {reference} vs {label}: faster at P={faster or 'none'}, "
                         f"slower at P={slower or 'none'}"
                         + (f"; crossover between P {', '.join(switches)}" if switches else ""))
    return lines


def plot(rows: list, sweep: list, path: str) -> None:
    """Predicted time against P per method, and spardl's against team count d, per network."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    networks = list(dict.fromkeys(r["network"] for r in rows + sweep))
    charts = bool(rows) + bool(sweep)
    fig, axes = plt.subplots(charts, len(networks), figsize=(6 * len(networks), 4.5 * charts), squeeze=False)
    for column, network in enumerate(networks):
        if rows:
            axis = axes[0][column]
            subset = [r for r in rows if r["network"] == network]
            for label in dict.fromkeys(r["label"] for r in subset):
                points = sorted((r["workers"], r["predicted_ms"]) for r in subset if r["label"] == label)
                axis.plot(*zip(*points), marker="o", label=label)
            axis.set(xscale="log", yscale="log", xlabel="workers P", ylabel="predicted ms per call", title=network)
            _label_ticks(axis, sorted({r["workers"] for r in subset}))
            axis.legend(fontsize=8)
        if sweep:
            axis = axes[-1][column]
            subset = [r for r in sweep if r["network"] == network]
            for workers in sorted({r["workers"] for r in subset}):
                points = sorted((r["teams"], r["predicted_ms"]) for r in subset if r["workers"] == workers)
                axis.plot(*zip(*points), marker="o", label=f"P={workers}")
            axis.set(xscale="log", xlabel="teams d", ylabel="predicted ms per call",
                     title=f"spardl vs teams ({network})")
            _label_ticks(axis, sorted({r["teams"] for r in subset}))
            axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label_ticks(axis, values: list) -> None:
    """Ticks of a log-scale x axis at exactly ``values``, written as plain numbers."""
    axis.set_xticks(values, [str(v) for v in values])
    axis.set_xticks([], minor=True)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring and the README's "Benchmarks, simulator,
    reports")."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default = " (default: %(default)s)"
    presets = ", ".join(f"{n.name} ({8e-9 / n.beta:g} Gb/s, {n.alpha * 1e6:g} us)" for n in PRESETS.values())
    parser.add_argument("--workers", default="16,32,64,128,256", help="P values, comma-separated" + default)
    parser.add_argument("--numel", type=int, default=1 << 18,
                        help="simulated gradient length, rounded up per P so that every SparDL block "
                             "keeps its share of the density" + default)
    parser.add_argument("--model-numel", type=int, default=VGG16_NUMEL,
                        help="n the predictions scale to (default: %(default)s, VGG-16)")
    parser.add_argument("--density", type=float, default=0.01, help="fraction of entries kept, in (0, 1]" + default)
    parser.add_argument("--methods", default="all", help="comma-separated names, or 'all' (the default)")
    parser.add_argument("--teams", default="1", help="spardl team counts d in the main table, comma-separated" + default)
    parser.add_argument("--sweep", default="",
                        help="P values at which to sweep spardl over every team count d dividing P (default: none)")
    parser.add_argument("--calls", type=int, default=1, help="modelled calls per method" + default)
    parser.add_argument("--warmup", type=int, default=1, help="calls run before them" + default)
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradients" + default)
    parser.add_argument("--network", default=",".join(PRESETS),
                        help=f"presets, comma-separated: {presets}" + default)
    parser.add_argument("--alpha", type=float, help="latency per message in seconds of a custom network (with --beta)")
    parser.add_argument("--beta", type=float, help="seconds per byte of a custom network (with --alpha)")
    parser.add_argument("--select-threads", type=int, default=1, help="threads of the selection timing" + default)
    parser.add_argument("--select-device", default="cpu", choices=["cpu", "cuda"],
                        help="where to time selection" + default)
    parser.add_argument("--select-rate", type=float,
                        help="a fixed selection throughput in entries/s instead of timing it here")
    parser.add_argument("--json", metavar="FILE",
                        help="write every row as a JSON list (key 'table': 'methods' or 'sweep')")
    parser.add_argument("--plot", metavar="FILE",
                        help="write a chart of predicted time against P, and against d with --sweep "
                             "(FILE.png; or .pdf, .svg, ...)")
    args = parser.parse_args(argv)
    args.methods = bench.usage_checked(parser, bench.method_names, args.methods)
    args.workers = bench.usage_checked(parser, bench.positive_ints, args.workers, "--workers")
    args.teams = bench.usage_checked(parser, bench.positive_ints, args.teams, "--teams")
    args.sweep = bench.usage_checked(parser, bench.positive_ints, args.sweep, "--sweep") if args.sweep else []
    bench.usage_checked(parser, compressors.base.check_density, args.density)
    unknown = [name for name in args.network.split(",") if name and name not in PRESETS]
    if unknown:
        parser.error(f"--network {','.join(unknown)}: unknown preset; valid: {', '.join(PRESETS)}")
    args.networks = [PRESETS[name] for name in args.network.split(",") if name]
    if args.select_device == "cuda" and not torch.cuda.is_available():
        parser.error("--select-device cuda: no CUDA device here")
    if args.numel < 1 or args.model_numel < 1:
        parser.error("--numel and --model-numel must be >= 1")
    if (args.alpha is None) != (args.beta is None):
        parser.error("--alpha and --beta go together")
    if args.alpha is not None:
        if not (0 <= args.alpha < math.inf and 0 <= args.beta < math.inf and args.alpha + args.beta > 0):
            parser.error(f"--alpha and --beta must be finite, >= 0 and not both 0, got {args.alpha:g} and {args.beta:g}")
        args.networks.append(Network("custom", args.alpha, args.beta))
    if args.calls < 1 or args.warmup < 0 or not args.networks:
        parser.error("--calls must be >= 1, --warmup >= 0, and at least one network given")
    if args.select_threads < 1:
        parser.error(f"--select-threads must be >= 1, got {args.select_threads}")
    if args.select_rate is not None and not 0 < args.select_rate < math.inf:
        parser.error(f"--select-rate must be a positive number of elements/s, got {args.select_rate:g}")
    bench.usage_checked(parser, bench.check_seed, args.seed)
    if args.json:
        bench.usage_checked(parser, bench.output_file, args.json, "--json")
    if args.plot:
        bench.usage_checked(parser, bench.plot_file, args.plot)
    return args


def main(argv=None) -> tuple:
    """Simulate, print the tables and crossovers, write JSON/plot; returns (rows, sweep rows)."""
    args = parse_args(argv)
    plan = []
    for workers in args.workers:
        bench.warn_skipped_teams(args.methods, args.teams, workers)
        plan += [(workers, run) for run in bench.method_runs(args.methods, args.teams, workers)]
    if not plan and not args.sweep:
        print("simulate.py: nothing to simulate: no method runs at any P (see the notes above)",
              file=sys.stderr)
        sys.exit(2)
    cost = SelectionCost(args.density, args.select_threads, args.select_rate, args.seed,
                         device=args.select_device)
    print(describe(cost, args), flush=True)
    rows, sweep = [], []
    for workers, (label, name, options) in plan:
        rows += simulate_row(label, name, options, workers, args, args.networks, cost)
    for workers in args.sweep:
        for teams in (d for d in range(1, workers + 1) if workers % d == 0):
            sweep += simulate_row(f"spardl(d={teams})", "spardl", {"teams": teams}, workers, args,
                                  args.networks, cost)
    if rows:
        print(format_tables(rows, "predicted_ms", "predicted ms per call (network + selection)"))
        print(format_tables(rows, "network_ms", "network ms per call (selection excluded)"))
        references = dict.fromkeys(r["label"] for r in rows if r["method"] == "spardl")  # every team count
        print("\n" + "\n".join(line for reference in references for line in crossovers(rows, reference)))
    if sweep:
        print(format_tables(sweep, "predicted_ms", "spardl against the team count d, predicted ms per call"))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([dict(r, table="methods") for r in rows] + [dict(r, table="sweep") for r in sweep],
                      handle, indent=1)
    if args.plot:
        plot(rows, sweep, args.plot)
    return rows, sweep


if __name__ == "__main__":
    main()
