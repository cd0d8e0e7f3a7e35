"""Where sparse synchronization pays on GPU clusters: a projection (docs/CHOOSING.md).

    python -m syncbench.gpu_projection --replays R.json --ops O.json --json rows.json
    python -m trainreport.projection rows.json             # its tables

**The cluster.** Nodes of 8 GPUs joined by NVLink (450 GB/s per GPU and direction, NVLink 4 on
an H100 or H200 SXM board), one network link per node of 25, 100 or 400 Gbit/s (a node with a
NIC per GPU is the same model at 8 times the rate), P = 8 to 1024 GPUs, rank r on node r // 8.

**Dense all-reduce, as NCCL costs it.** The form of NCCL's own tuning model (``src/graph/
tuning.cc``): a latency plus the bytes over an algorithm bandwidth, the cheaper of a ring and a
tree (:func:`nccl_allreduce`). The ring takes 2(P-1) steps, 2(N-1) of them between the N nodes;
its bus bandwidth is the node's link (NVLink within one node) and its algorithm bandwidth that
times P / (2(P-1)). The tree's latency grows with log2 N; its bandwidth is half of 0.9 times
the link's. Per-step latencies are NCCL's for its Simple protocol. ``dense(wire=fp16)`` is
torch's ``fp16_compress_hook``: half the bytes, plus two casts over the gradient in device
memory (:data:`HBM_RATE`). PowerSGD (rank 4, torch's hook) sends its P and Q factors and its
uncompressed tensors in three such all-reduces; its local work (matrix products and an
orthogonalization per matrix) was never measured on a GPU here, so its rows are its
communication only: a lower bound.

**Sparse methods, as this library runs them over NCCL's point-to-point rounds.** Each runs for
real on P in-process ranks at a small n (:func:`syncbench.simulator.record_calls`); every
round's messages, scaled to the model's n, cross the cluster as
:class:`syncbench.network.Cluster` charges them: a message between nodes on both nodes' links,
shared by the round's other messages; within a node over NVLink. Their local work is
:class:`GpuLocalWork`: fitted on the kept H200 replays (``runs/lean-engine/gpu-h200-2026-11-28``,
one rank's local work at P = 4, n = 14.7M) and this library's operation counts.

Every constant the projection assumes is a named value of this module; what the model leaves
out is in docs/CHOOSING.md beside its tables.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import cli
from .network import Cluster, parse_rate
from .simulator import record_calls, simulated_numel, traffic_between

__all__ = [
    "GPUS_PER_NODE",
    "NVLINK_RATE",
    "HBM_RATE",
    "NET_ALPHA",
    "NVLINK_ALPHA",
    "RING_BASE",
    "RING_NVLINK",
    "RING_NET",
    "TREE_NVLINK",
    "TREE_NET",
    "TREE_SHARE",
    "TREE_CAP",
    "RATES",
    "WORKERS",
    "MODELS",
    "SPARSE",
    "gpu_cluster",
    "nccl_allreduce",
    "powersgd_sizes",
    "model_shapes",
    "OpsFit",
    "GpuLocalWork",
    "dense_rows",
    "sparse_rows",
    "main",
]

GPUS_PER_NODE = 8
#: Bytes/s one GPU sends over NVLink 4 (900 GB/s both ways on an H100 or H200 SXM board).
NVLINK_RATE = 450e9
#: Bytes/s an elementwise pass over device memory moves (about 60% of an H200's 4.8 TB/s).
HBM_RATE = 3.0e12
#: Seconds per point-to-point message between nodes and within one: NCCL's per-step latencies
#: of its Simple protocol (9.6 and 3.4 us) plus about 10 us and 5 us for posting a round.
NET_ALPHA = 20e-6
NVLINK_ALPHA = 8e-6
# NCCL's latencies (seconds) for the Simple protocol: a ring's base and per step, a tree's per
# level, on NVLink and on the network; its tree runs at 0.9 of the link, at most 80 GB/s.
RING_BASE, RING_NVLINK, RING_NET = 8.4e-6, 3.4e-6, 9.6e-6
TREE_NVLINK, TREE_NET = 28e-6, 50e-6
TREE_SHARE, TREE_CAP = 0.9, 80e9

RATES = ("25gbit", "100gbit", "400gbit")
WORKERS = (8, 16, 32, 64, 128, 256)
#: The projected gradients: VGG-16 for CIFAR-10 (the paper's) and BERT-large's 340M.
MODELS = {"vgg16": 14_728_266, "bert-large": 335_174_458}
#: The sparse rows: (label, method, options).
SPARSE = (
    ("spardl", "spardl", {}),
    ("spardl(wire=fp16)", "spardl", {"wire": "fp16"}),
    ("gtopk", "gtopk", {}),
    ("topk", "topk", {}),
)
POWERSGD_RANK = 4
_REPLAYED = 14_728_266  # the n of the kept GPU replays
FIT_MAX = 16  # operation counts are fitted on P <= 16; larger counted P check the fit


def gpu_cluster(rate: str) -> Cluster:
    """Nodes of :data:`GPUS_PER_NODE` GPUs on NVLink, each node with one link of ``rate``."""
    return Cluster(
        f"gpu:{GPUS_PER_NODE}x@{rate}",
        (parse_rate(rate),),
        ranks_per_host=GPUS_PER_NODE,
        alpha=NET_ALPHA,
        shm_alpha=NVLINK_ALPHA,
        shm_rate=GPUS_PER_NODE * NVLINK_RATE,
    )


def nccl_allreduce(nbytes: float, workers: int, rate: float) -> tuple:
    """Seconds of NCCL's all-reduce of ``nbytes`` on ``workers`` GPUs, and the algorithm.

    ``rate``: bytes/s of a node's link (module docstring). Returns ``(seconds, "ring"|"tree")``.
    """
    if workers == 1:
        return 0.0, "none"
    nodes = math.ceil(workers / GPUS_PER_NODE)
    per_node = min(workers, GPUS_PER_NODE)
    bus = NVLINK_RATE if nodes == 1 else min(rate, NVLINK_RATE)
    steps, between = 2 * (workers - 1), 2 * (nodes - 1)
    ring_latency = RING_BASE + (steps - between) * RING_NVLINK + between * RING_NET
    if nodes > 1 and nbytes >= workers / 16 * 65536:
        ring_latency *= 1.9  # NCCL's allowance for a multi-node ring's plateau
    ring = ring_latency + nbytes / (bus * workers / steps)
    tree_latency = 2 * ((per_node - 1) * TREE_NVLINK + math.log2(nodes) * TREE_NET)
    tree = tree_latency + nbytes / (0.5 * min(TREE_SHARE * bus, TREE_CAP))
    return (ring, "ring") if ring <= tree else (tree, "tree")


def powersgd_sizes(shapes: list, rank: int = POWERSGD_RANK) -> tuple:
    """Entries PowerSGD all-reduces per step: ``(p, q, uncompressed)``.

    As torch's ``powerSGD_hook``: a tensor of two or more dimensions is a matrix of
    ``shape[0]`` rows, compressed when ``rows * cols`` exceeds ``(rows + cols) * rank * 2`` (its
    ``min_compression_rate``); the rest travels whole.
    """
    p = q = whole = 0
    for shape in shapes:
        numel = math.prod(shape)
        if len(shape) < 2:
            whole += numel
            continue
        rows, cols = shape[0], numel // shape[0]
        r = min(rows, cols, rank)
        if rows * cols > (rows + cols) * r * 2:
            p, q = p + rows * r, q + cols * r
        else:
            whole += numel
    return p, q, whole


def model_shapes(name: str) -> list:
    """The parameter shapes of a :data:`MODELS` entry, built on the meta device."""
    import torch

    from models.bert import bert_large
    from models.vgg import vgg16

    with torch.device("meta"):
        model = vgg16(10, (3, 32, 32)) if name == "vgg16" else bert_large(30522, (128,), 30522)
    return [tuple(p.shape) for p in model.parameters()]


@dataclass(frozen=True)
class OpsFit:
    """Operations per call as ``a + b log2 P + c (log2 P)^2``, fitted on counted sizes."""

    coefficients: tuple

    @classmethod
    def fit(cls, counts: dict) -> OpsFit:
        """Least squares over ``{P: operations}`` (at least three P)."""
        x = np.log2(np.array(sorted(counts), dtype=float))
        y = np.array([counts[p] for p in sorted(counts)], dtype=float)
        c, b, a = np.polyfit(x, y, 2)
        return cls((float(a), float(b), float(c)))

    def ops(self, workers: int) -> float:
        """The fitted operations of one call at ``workers`` ranks."""
        a, b, c = self.coefficients
        x = math.log2(workers)
        return a + b * x + c * x * x


@dataclass(frozen=True)
class GpuLocalWork:
    """One rank's local work on the GPU per call: two bounds (docs/CHOOSING.md).

    ``per_entry``: seconds per gradient entry of the floor with error feedback (one top-k over
    the accumulated gradient; its replayed median over n); ``overhead[label]``: the method's
    replayed median less that floor, at P = 4 and n = 14.7M; ``fits[label]``: its operations per
    call (:class:`OpsFit`, fitted on P <= :data:`FIT_MAX`; ``checks``: the counts beyond, beside
    what the fit predicts). The low bound holds the overhead fixed in n and grows it with the
    operations (a call bound by its launches); the high bound also grows it with n.
    """

    per_entry: float
    overhead: dict
    fits: dict
    checks: list = ()  # (label, P, counted, predicted): the counts beyond the fit's P

    @classmethod
    def from_rows(cls, replays: list, counts: list) -> GpuLocalWork:
        """From replay rows and operation rows.

        Replay rows have ``label`` and ``median_ms`` (the floor+ef row among them); operation
        rows are :mod:`syncbench.opcount`'s ``--json`` (``method``, ``wire``, ``workers``, ``ops``).
        """
        medians = {}
        for row in replays:
            medians.setdefault(row["label"], []).append(row["median_ms"] * 1e-3)
        floor = statistics.median(medians["floor+ef"])
        overhead = {
            label: max(0.0, statistics.median(times) - floor)
            for label, times in medians.items()
            if label not in ("floor", "floor+ef")
        }
        by_label = {}
        for row in counts:
            wire = row["wire"]
            label = row["method"] if wire == "fp32" else f"{row['method']}(wire={wire})"
            by_label.setdefault(label, {})[row["workers"]] = row["ops"]
        fits = {
            label: OpsFit.fit({p: n for p, n in ops.items() if p <= FIT_MAX})
            for label, ops in by_label.items()
        }
        checks = [
            (label, p, n, fits[label].ops(p))
            for label, ops in by_label.items()
            for p, n in sorted(ops.items())
            if p > FIT_MAX
        ]
        return cls(floor / _REPLAYED, overhead, fits, checks)

    def bounds(self, label: str, workers: int, numel: int) -> tuple:
        """``(low, high)`` seconds of one call of ``label`` at ``workers`` ranks and ``numel``."""
        fit = self.fits[label]
        grown = self.overhead[label] * fit.ops(workers) / fit.ops(4)
        base = self.per_entry * numel
        return base + grown, base + grown * max(1.0, numel / _REPLAYED)


def dense_rows(model: str, numel: int, shapes: list, workers: int, rate: str) -> list:
    """The rows of NCCL's dense all-reduce (fp32, fp16) and PowerSGD at one P and link."""
    link = parse_rate(rate)
    rows = []
    for label, nbytes, local in (
        ("dense", 4 * numel, 0.0),
        ("dense(wire=fp16)", 2 * numel, 2 * 6 * numel / HBM_RATE),
    ):
        seconds, algorithm = nccl_allreduce(nbytes, workers, link)
        rows.append(_row(model, numel, label, workers, rate, seconds, (local, local), algorithm))
    p, q, whole = powersgd_sizes(shapes)
    seconds = sum(nccl_allreduce(4 * size, workers, link)[0] for size in (p, q, whole) if size)
    rows.append(
        _row(model, numel, "powersgd", workers, rate, seconds, (0.0, 0.0), "communication only")
    )
    return rows


def sparse_rows(
    label: str, name: str, options: dict, workers: int, density: float, local: GpuLocalWork
) -> list:
    """Record ``name`` at ``workers`` ranks once; its rows for every model and link."""
    numel = simulated_numel(100_000, workers, density)
    per_rank = record_calls(name, options, workers, numel, density, 3, warmup=1)
    # each timed call's traffic between ranks, per round, once for every model and link
    traffic = [traffic_between([records[c] for records in per_rank]) for c in (1, 2)]
    clusters = {rate: gpu_cluster(rate) for rate in RATES}
    rows = []
    for model, model_numel in MODELS.items():
        scale = model_numel / numel
        bounds = local.bounds(label, workers, model_numel)
        for rate, cluster in clusters.items():
            seconds = statistics.fmean(
                float(cluster.traffic_seconds(messages, sent * scale).sum())
                for messages, sent in traffic
            )
            rows.append(_row(model, model_numel, label, workers, rate, seconds, bounds, "rounds"))
    return rows


def _row(model, numel, label, workers, rate, network, local, how) -> dict:
    """One projected row (milliseconds)."""
    return {
        "model": model,
        "numel": numel,
        "label": label,
        "workers": workers,
        "nodes": math.ceil(workers / GPUS_PER_NODE),
        "rate": rate,
        "how": how,
        "network_ms": network * 1e3,
        "local_low_ms": local[0] * 1e3,
        "local_high_ms": local[1] * 1e3,
        "low_ms": (network + local[0]) * 1e3,
        "high_ms": (network + local[1]) * 1e3,
    }


def _load(paths: list) -> list:
    """The rows of JSON lists at ``paths``, in order."""
    rows = []
    for path in paths:
        rows += json.loads(Path(path).read_text())
    return rows


def main(argv=None) -> list:
    """``python -m syncbench.gpu_projection``: record, project, write the rows to ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m syncbench.gpu_projection", description=__doc__)
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="P, comma-separated")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument(
        "--replays", nargs="+", required=True, metavar="JSON", help="GPU replay rows (floor+ef too)"
    )
    parser.add_argument(
        "--ops", nargs="+", required=True, metavar="JSON", help="syncbench.opcount rows, P 2..16+"
    )
    parser.add_argument("--json", metavar="FILE", help="write the projected rows here")
    args = parser.parse_args(argv)
    workers = cli.usage_checked(parser, cli.positive_ints, args.workers, "--workers")
    if not 0 < args.density <= 1 or min(workers) < GPUS_PER_NODE:
        parser.error(f"--density in (0, 1] and every P at least {GPUS_PER_NODE}")
    local = GpuLocalWork.from_rows(_load(args.replays), _load(args.ops))
    for label, p, counted, predicted in local.checks:
        print(
            f"  operations of {label} at P={p}: {counted} counted, "
            f"{predicted:.1f} fitted on P <= {FIT_MAX}"
        )
    rows = []
    for model, numel in MODELS.items():
        shapes = model_shapes(model)
        for p in workers:
            for rate in RATES:
                rows += dense_rows(model, numel, shapes, p, rate)
    for p in workers:
        for label, name, options in SPARSE:
            start = time.perf_counter()
            rows += sparse_rows(label, name, options, p, args.density, local)
            print(f"  {label} at P={p}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"{len(rows)} rows in {args.json}: python -m trainreport.projection {args.json}")
    return rows


if __name__ == "__main__":
    main()
