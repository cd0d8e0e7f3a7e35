"""Predict synchronization time at scale from the real methods run on an in-process group.

Every method runs for real on P threads of one process on the benchmark's heavy-tailed
gradients, at a modest n so that data-dependent sizes (gtopk merges, oktopk regions, SAG
unions) are real. A :class:`allreducers.transports.recording.RecordingTransport` logs every
message with its round, and a :class:`SelectionCounter` logs how many entries each rank hands to
the selector.

The model, per call; the prediction is the mean over the recorded calls after the warm-up, with
each kind of call at its share of the method's period (:func:`call_weights`):

- simulated n: the requested n rounded up to P*B entries with B*density at or just above a
  whole number (:func:`simulated_numel`), so that SparDL's per-block budget max(1, int(B*density))
  keeps the density's share as it does at the model's n.
- scale factor s = model_numel / n: bytes and scanned entries grow linearly with n; message and
  round counts do not (exact for fixed-size messages; an approximation where sizes depend on
  the data, and it ignores the few count words that lead variable-size messages).
- bytes: those the real method sends at its option ``wire`` (``allreducers.wire``): at fp32 8
  bytes a sparse entry (int32 index, float32 value) and 4 a dense value; at fp16 or bf16 4
  bytes a sparse entry where indices travel as 16-bit offsets (6 where they stay int32) and 2 a
  dense value, plus a header of 12 + 8L + 8R bytes a message (L lists, R runs of offsets),
  which the scale factor grows with the rest.
- network: the rounds run in lock step; each round costs what the network model says of what
  every rank sends in it (:mod:`syncbench.network`); the network time is the sum over rounds.
  A cluster of hosts (:class:`syncbench.network.Cluster`) is told where each message goes, to
  charge it on the links it crosses; there a dense all-reduce is spread over its rounds as
  MPICH's recursive halving and doubling sends it (:func:`allreduce_steps`).
  Messages a method leaves out of its own traffic count are left out here too. A dense
  all-reduce counted as R rounds is spread evenly over its R rounds, one message per round.
- selection: max over ranks of the summed time of that rank's selections, each a vector of s
  times the recorded length, priced by a :class:`SelectionCost`, times the network model's
  ``compute_share`` (ranks sharing fewer cores than there are ranks compute slower).
- predicted time = network + selection. Packing, scatter-adds and copies are not modelled.
- or, with a :class:`syncbench.local_work.ReplayedLocalWork` (``--local-work replay``): predicted
  time = network + local work, rank 0's whole share of each call (selection, accumulation,
  packing, scatter-adds, copies, merges) replayed alone in this process at two sizes, fitted as
  fixed + per-entry seconds, evaluated at the model's n, times ``compute_share``; the selection
  term is then part of it, reported but not added.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import numpy as np
import torch

import compressors
from allreducers.transports.local import LocalGroup, LocalTransport
from allreducers.transports.recording import RecordingTransport

from .gradients import SyntheticGradients
from .local_work import ReplayedLocalWork
from .network import Cluster, SharedLink
from .plan import row_wire
from .selection_cost import SelectionCost, SelectionCounter
from .summary import summarize_counts

__all__ = [
    "VGG16_NUMEL",
    "SharedSumGroup",
    "SharedSumTransport",
    "record_calls",
    "call_weights",
    "traffic_per_round",
    "allreduce_steps",
    "traffic_between",
    "network_seconds",
    "predict_call",
    "predict",
    "simulated_numel",
    "held_buffers",
    "simulate_row",
    "replayed_local_work",
    "network_row",
]

VGG16_NUMEL = 14_728_266


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

    def rank(self, rank: int) -> SharedSumTransport:
        """The transport of rank ``rank`` (call it from the thread that plays that rank)."""
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


def record_calls(
    name: str,
    options: dict,
    workers: int,
    numel: int,
    density: float,
    calls: int,
    seed: int = 0,
    source=None,
    warmup: int = 0,
) -> list:
    """Run ``calls`` synchronizations of method ``name`` on in-process ranks.

    The group has ``workers`` ranks; the first ``warmup`` calls are warm-up.

    Returns ``per_rank[r][c]``: rank r's record of call c with the keys the benchmark records
    (``bytes``, ``messages``, ``rounds``, ``nnz``) plus ``events`` (its logged messages),
    ``selections`` (the lengths of the vectors handed to the selector, per kind) and ``weight``
    (its weight in the mean over one period, :func:`call_weights`). Rank r's gradient at call c
    is ``source.get(r, c)``, by default the benchmark's synthetic gradients of ``seed``.
    """
    source = source or SyntheticGradients(numel, seed)

    def body(transport, counter):
        recorder = RecordingTransport(transport)
        sync = compressors.create(name, recorder, numel=numel, density=density, **options)
        records = []
        for call, weight in enumerate(call_weights(sync, warmup, calls)):
            grad = source.get(transport.rank, call)
            counter.take()
            sync.allreduce(grad)
            stats = sync.stats
            records.append(
                {
                    "bytes": stats["bytes_sent"],
                    "messages": stats["messages"],
                    "rounds": stats["rounds"],
                    "host_syncs": stats["host_syncs"],
                    "nnz": stats["nnz"],
                    "events": recorder.take(),
                    "selections": counter.take(),
                    "weight": weight,
                }
            )
        return records

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with SelectionCounter() as counter:
            return SharedSumGroup(workers).run(body, counter)
    finally:
        torch.set_num_threads(threads)


def call_weights(sync, warmup: int, calls: int) -> list:
    """The weights of the calls of ``sync`` in the mean over one period.

    Calls 0 .. ``calls``-1, weighed over one period of its call kinds
    (:meth:`Synchronizer.call_kind`), so that a method's periodic extra work (Ok-Topk's exact calls:
    1 in 32) is priced at its share. Each kind's share of the period goes in equal parts to the
    calls of that kind after the ``warmup``, else to the warm-up calls of that kind, else to call 0
    (which does all the periodic work: a slight over-estimate).
    """
    kinds = [sync.call_kind(step) for step in range(calls)]
    period = [sync.call_kind(step) for step in range(sync.kind_period)]
    weights = [0.0] * calls
    for kind in dict.fromkeys(period):
        holders = (
            [c for c in range(warmup, calls) if kinds[c] == kind]
            or [c for c in range(min(warmup, calls)) if kinds[c] == kind]
            or [0]
        )
        for call in holders:
            weights[call] += period.count(kind) / len(period) / len(holders)
    return weights


def traffic_per_round(records: list) -> tuple:
    """What each rank sends in each round of one call.

    Returns ``(messages, sent)``, arrays of shape (ranks, rounds), from every rank's record of the
    call (the counted rounds only).
    """
    length = max(r["rounds"] for r in records)
    messages = np.zeros((len(records), length))
    sent = np.zeros((len(records), length))
    for rank, record in enumerate(records):
        for event in record["events"]:
            if event.round >= length:
                continue  # traffic the method does not count
            if event.kind == "send":
                messages[rank, event.round] += 1
                sent[rank, event.round] += event.nbytes
            elif event.kind == "allreduce":
                span = slice(event.round, event.round + event.rounds)
                messages[rank, span] += 1
                sent[rank, span] += event.nbytes / event.rounds
    return messages, sent


def allreduce_steps(rank: int, workers: int, rounds: int) -> list:
    """Where an all-reduce counted as ``rounds`` rounds sends, as ``[(peer, share)]`` per round.

    With P a power of two and 2 log2 P rounds, the recursive halving and doubling of MPICH's
    large all-reduce (reduce-scatter with peers at distance 1, 2, 4, ..., halving the vector each
    time, then the all-gather back): the shares of the rank's counted bytes are those of
    n/2, n/4, ..., n/P, n/P, ..., n/2. Otherwise a ring: the right neighbour, equal shares.
    """
    levels = workers.bit_length() - 1
    if workers > 1 and workers == 1 << levels and rounds == 2 * levels:
        halving = [(rank ^ (1 << k), 0.5 ** (k + 1)) for k in range(levels)]
        steps = halving + halving[::-1]
        total = sum(share for _, share in steps)
        return [(peer, share / total) for peer, share in steps]
    return [((rank + 1) % workers, 1 / rounds)] * rounds if rounds > 0 else []


def traffic_between(records: list) -> tuple:
    """What each rank sends to each rank in each round of one call.

    Returns ``(messages, sent)``, arrays of shape (rounds, ranks, ranks): ``sent[i, w, v]`` bytes
    from rank w to rank v in round i (the counted rounds only); an all-reduce as
    :func:`allreduce_steps` spreads it.
    """
    length, workers = max(r["rounds"] for r in records), len(records)
    messages = np.zeros((length, workers, workers))
    sent = np.zeros((length, workers, workers))
    for rank, record in enumerate(records):
        for event in record["events"]:
            if event.round >= length:
                continue  # traffic the method does not count
            if event.kind == "send":
                messages[event.round, rank, event.peer] += 1
                sent[event.round, rank, event.peer] += event.nbytes
            elif event.kind == "allreduce":
                steps = allreduce_steps(rank, workers, event.rounds)
                for step, (peer, share) in enumerate(steps, start=event.round):
                    if step < length:
                        messages[step, rank, peer] += 1
                        sent[step, rank, peer] += event.nbytes * share
    return messages, sent


def network_seconds(records: list, network, scale: float) -> float:
    """Seconds one call spends in the network (model: module docstring).

    A network with ``traffic_seconds`` (a :class:`syncbench.network.Cluster`) is given every
    round's traffic from each rank to each rank (:func:`traffic_between`), the others each rank's
    (:func:`traffic_per_round`).
    """
    if hasattr(network, "traffic_seconds"):
        messages, sent = traffic_between(records)
        return float(network.traffic_seconds(messages, sent * scale).sum())
    messages, sent = traffic_per_round(records)
    return float(network.round_seconds(messages, sent * scale).sum())


def predict_call(records: list, network, scale: float, cost: SelectionCost) -> dict:
    """Predicted seconds of one call from every rank's record of it (model: module docstring).

    ``network`` is one of :mod:`syncbench.network`'s models.
    """
    net = network_seconds(records, network, scale)
    select = max(
        sum(
            cost.seconds(kind, np.multiply(lengths, scale))
            for kind, lengths in r["selections"].items()
        )
        for r in records
    ) * network.compute_share(len(records))
    return {"network": net, "select": select, "total": net + select}


def predict(per_rank: list, network, scale: float, cost: SelectionCost) -> dict:
    """The mean of :func:`predict_call` over one period of call kinds (the records' ``weight``).

    ``per_rank[r][c]`` as :func:`record_calls` returns.
    """
    calls = [
        (predict_call([r[c] for r in per_rank], network, scale, cost), per_rank[0][c]["weight"])
        for c in range(len(per_rank[0]))
        if per_rank[0][c]["weight"]
    ]
    return {key: sum(call[key] * weight for call, weight in calls) for key in calls[0][0]}


def simulated_numel(numel: int, workers: int, density: float) -> int:
    """``numel`` rounded up so that every block keeps its share of the density.

    Rounded up to ``workers * B`` where ``B * density`` is a whole number or a little more (less
    than 1/B of it): the smallest B >= ceil(numel / workers) whose block keeps ceil(ceil(numel /
    workers) * density) entries. Then every block of every team count keeps its share of the
    density, as the model's large blocks do (module docstring).
    """
    kept = math.ceil(math.ceil(numel / workers) * density)
    return workers * math.ceil(kept / density)


def held_buffers(workers: int) -> int:
    """The float32 buffers of n entries that recording one method at P holds at once, at least.

    The synthetic gradients' scale, and per rank (a thread of this process) its gradient, its
    synchronizer's residual and its result: 3 P + 1. A run at n holds 4 n times as many bytes
    (and more: the methods' own buffers), which ``scripts/simulate.py`` checks against the
    available memory before it starts.
    """
    return 3 * workers + 1


def simulate_row(
    label: str,
    name: str,
    options: dict,
    workers: int,
    settings,
    networks: list,
    cost: SelectionCost,
    local_work: ReplayedLocalWork | None = None,
) -> list:
    """Record one method at one P and return one row per network.

    ``settings`` gives ``numel`` (simulated), ``model_numel`` (predicted), ``density``, ``warmup``,
    ``calls`` and ``seed``; ``local_work``: the replayed local-work model, ``None`` for selection
    only (module docstring).
    """
    start = time.perf_counter()
    numel = simulated_numel(settings.numel, workers, settings.density)
    per_rank = record_calls(
        name,
        options,
        workers,
        numel,
        settings.density,
        settings.warmup + settings.calls,
        settings.seed,
        warmup=settings.warmup,
    )
    print(
        f"  simulated {label} at P={workers}, n={numel:,} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    local = None
    if local_work is not None:
        local = replayed_local_work(
            label, name, options, workers, numel, settings, per_rank, local_work
        )
    timed = [records[settings.warmup :] for records in per_rank]
    scale = settings.model_numel / numel
    counts = summarize_counts(timed)
    scanned = statistics.fmean(
        sum(record["weight"] * sum(map(sum, record["selections"].values())) for record in records)
        for records in per_rank
    )  # as predict weighs
    common = {
        "method": name,
        "label": label,
        "teams": options.get("teams", 1),
        "srs": options.get("srs"),
        "sag": options.get("sag"),
        "wire": row_wire(options),
        "workers": workers,
        "numel": numel,
        "model_numel": settings.model_numel,
        "density": settings.density,
    }
    tail = {
        **counts,
        "model_bytes_per_rank": counts["bytes_per_rank"] * scale,
        "scanned_per_rank": scanned,
        "calls": settings.calls,
        "seed": settings.seed,
    }
    return [
        network_row(common, tail, per_rank, network, scale, cost, local) for network in networks
    ]


def replayed_local_work(label, name, options, workers, numel, settings, per_rank, local_work):
    """The replayed local work of rank 0 (:class:`ReplayedLocalWork`) as a row's ``local_*`` keys.

    Plus ``local_seconds``, its fit evaluated at the model's n; the time it took is printed.
    """
    start = time.perf_counter()
    sizes = local_work.sizes(
        numel, settings.model_numel, lambda n: simulated_numel(n, workers, settings.density)
    )
    fitted, points = local_work.measure(
        name,
        options,
        workers,
        sizes,
        settings.density,
        [record["weight"] for record in per_rank[0]],
        settings.seed,
        SharedSumGroup,
    )
    print(
        f"  replayed {label}'s rank 0 at P={workers}, "
        f"n={', '.join(f'{n:,}' for n in sizes)} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return {
        "local_fixed_ms": fitted.fixed * 1e3,
        "local_per_entry_ns": fitted.per_entry * 1e9,
        "local_points": [[n, seconds * 1e3] for n, seconds in points],
        "local_seconds": fitted.seconds(settings.model_numel),
    }


def network_row(common, tail, per_rank, network, scale, cost, local) -> dict:
    """The row of one method at one P on ``network``.

    ``common`` (the method, P, n, ...), the prediction (:func:`predict` of ``per_rank`` at
    ``scale``; with ``local``, :func:`replayed_local_work`'s keys), then ``tail`` (the counts).
    """
    predicted = predict(per_rank, network, scale, cost)
    workers = common["workers"]
    share = network.compute_share(workers)
    local_seconds = predicted["select"] if local is None else local["local_seconds"] * share
    total = predicted["total"] if local is None else predicted["network"] + local_seconds
    return {
        **common,
        "network": network.name,
        "alpha": network.alpha,
        "beta": network.beta,
        "shared_link": isinstance(network, SharedLink),
        **({"topology": network.topology(workers)} if isinstance(network, Cluster) else {}),
        "compute_share": share,
        "predicted_ms": total * 1e3,
        "network_ms": predicted["network"] * 1e3,
        "select_ms": predicted["select"] * 1e3,
        "local_work": "select" if local is None else "replay",
        "local_ms": local_seconds * 1e3,
        **(
            {}
            if local is None
            else {key: value for key, value in local.items() if key != "local_seconds"}
        ),
        "select_rate": cost.fixed_rate,
        **tail,
    }
