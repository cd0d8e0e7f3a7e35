"""The benchmark's two ways to time every row.

Under MPI, each rank synchronizing its own gradients (:func:`mpi_rows`), or one rank's share
replayed alone in this process (:func:`replay_rows`, see :mod:`syncbench.replay`). ``args`` is the
parsed command line of ``scripts/bench_allreduce.py``.

Every row records its wire format (``wire``: ``fp32``, ``fp16`` or ``bf16``; the floor rows
replay SparDL's fp32 messages), the network it ran on (:func:`network_label`) and each rank's
torch thread count (``threads``, a list in rank order), so tables of different settings never
mix unseen.

SparDL's rows also record ``layout`` and ``teams_requested`` (the ``--teams`` value, ``auto`` in
the row ``spardl(d=auto)``). An auto row's synchronizer chooses its configuration when the row is
built, from this rank's gradient of call 0, before any timed call (a replay takes the choice its
recording made); the row then records the chosen ``teams``, ``sag`` and ``layout`` and the
probe's times per candidate, ``auto_probe`` (:attr:`compressors.spardl.SparDL.auto`).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

import compressors
from allreducers.transports import local_group
from allreducers.transports.environment import cluster_topology

from . import plan
from .floor import FLOOR_RUNS, FLOORS, FloorRun, spardl_events
from .opcount import count_method
from .replay import replay_runs
from .summary import summarize
from .timing import MethodRun, mpi_gradients, time_runs

__all__ = [
    "NETWORK_VARIABLE",
    "network_label",
    "runs_to_time",
    "NotingChoice",
    "noting_choices",
    "spardl_columns",
    "operation_counts",
    "mpi_rows",
    "replay_rows",
]

NETWORK_VARIABLE = "SPARDL_NETWORK_RATE"  # set by scripts/shaped_network.sh to its --rate


def network_label(replayed: bool = False) -> str:
    """The network a run times.

    The shaped link's rate as ``SPARDL_NETWORK_RATE`` gives it (e.g. ``1gbit``), else ``loopback``;
    ``none`` for a replay, which sends nothing.
    """
    if replayed:
        return "none"
    return os.environ.get(NETWORK_VARIABLE) or "loopback"


def runs_to_time(args, workers: int, speaks: bool) -> list:
    """:func:`plan.method_runs` at P = ``workers``, with ``args.options`` (``--method-option``).

    The skipped SparDL settings are said on stderr if ``speaks``. Exit status 2, with one line
    if ``speaks``, when a row's options do not work at P (``compressors.try_options``) or no
    row is left to time.
    """
    layouts = getattr(args, "layout", None) or (plan.LAYOUT_DEFAULT,)
    if speaks:
        for note in plan.skipped(args.methods, args.teams, workers, args.sag, layouts):
            print(f"note: {note}", file=sys.stderr)
    options = getattr(args, "options", {})
    wires = getattr(args, "wire", None) or (plan.WIRE_DEFAULT,)
    runs = plan.method_runs(
        args.methods, args.teams, workers, args.srs, args.sag, options, wires, layouts
    )
    for label, name, chosen in runs:
        if not options.get(name):
            continue
        try:
            compressors.try_options(name, workers, args.density, **chosen)
        except ValueError as error:
            if speaks:
                print(
                    f"bench_allreduce.py: error: --method-option: {label} at P = {workers}: "
                    f"{error}",
                    file=sys.stderr,
                )
            sys.exit(2)
    if not runs:
        if speaks:
            print(
                f"bench_allreduce.py: nothing to time at P = {workers} (see the note above)",
                file=sys.stderr,
            )
        sys.exit(2)
    return runs


class NotingChoice:
    """A run whose SparDL synchronizer may choose its configuration (``teams="auto"``).

    Times as ``run`` does, then notes the synchronizer's :attr:`~compressors.spardl.SparDL.auto`
    record in ``chosen`` (a dict, under ``index``), where the row is summarized later.
    """

    def __init__(self, run, sync, chosen: dict, index: int) -> None:
        self.run, self.sync, self.chosen, self.index = run, sync, chosen, index

    def time(self, grad: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> dict:
        """One call of ``run``, then the note."""
        record = self.run.time(grad, exact, out)
        self.chosen[self.index] = self.sync.auto
        return record


def noting_choices(runs: list, factories: list, chosen: dict, gradient=None) -> list:
    """``factories`` with each SparDL row's run wrapped in :class:`NotingChoice`.

    ``gradient``: where given (under MPI), a ``teams="auto"`` row chooses when it is built, from
    ``gradient(0)``'s gradient, so that its probe is outside the timed calls.
    """
    wrapped = list(factories)
    for index, (_, name, _) in enumerate(runs):
        if name != plan.SPARDL:
            continue

        def build(factory=factories[index], index=index):
            run = factory()
            sync = run.sync if hasattr(run, "sync") else run.run.sync  # a MethodRun or Replayed
            if gradient is not None:
                sync.choose(gradient(0)[0])
            return NotingChoice(run, sync, chosen, index)

        wrapped[index] = build
    return wrapped


def spardl_columns(options: dict, auto) -> dict:
    """A SparDL row's ``teams_requested`` and ``layout``.

    With ``teams="auto"`` also the chosen ``teams``, ``sag`` and ``layout`` and the probe's
    times (``auto_probe``, ``auto_seconds``).
    """
    columns = {
        "teams_requested": options.get("teams", 1),
        "layout": options.get("layout", plan.LAYOUT_DEFAULT),
    }
    if auto is not None and options.get("teams") == plan.AUTO:
        columns.update(
            teams=auto["teams"],
            sag=auto["sag"],
            layout=auto["layout"],
            auto_probe=auto["probe"],
            auto_seconds=auto["probe_seconds"],
        )
    return columns


def operation_counts(args, runs: list, run_on) -> list:
    """With ``--count-ops``, per run the operations of one call on rank 0 (else ``[]``).

    ``run_on(count)`` runs ``count(transport)`` on every rank (a collective) and returns rank
    0's result: a fresh synchronizer's second call (:func:`syncbench.opcount.count_method`).
    """
    if not getattr(args, "count_ops", False):
        return []
    source = args.source

    def counter(name, options):
        def count(transport):
            def gradient(call):
                return source.get(transport.rank, call)

            return count_method(transport, name, source.numel, args.density, gradient, **options)

        return count

    return [run_on(counter(name, options)) for _, name, options in runs]


def mpi_rows(args) -> list:
    """Time every row under MPI on ``MPI.COMM_WORLD``.

    The rows on rank 0, [] elsewhere. Threads per rank and MPICH's yielding get the host's defaults
    where the user set nothing, before MPI starts (``allreducers.transports.environment``).
    """
    from allreducers.transports.environment import apply_launch_defaults

    apply_launch_defaults()
    from mpi4py import MPI

    from allreducers.transports.lifecycle import abort_on_uncaught_exception
    from allreducers.transports.mpi import MPITransport
    from allreducers.transports.placement import place_rank

    abort_on_uncaught_exception()
    comm = MPI.COMM_WORLD
    place_rank(comm, "cpu")  # torch threads: this host's cores shared by its ranks, as in training
    threads = comm.gather(torch.get_num_threads(), root=0)
    source = args.source
    workers = comm.Get_size()
    runs = runs_to_time(args, workers, speaks=comm.Get_rank() == 0)
    factories = [
        lambda name=name, options=options: MethodRun(
            MPITransport(comm), name, options, source.numel, args.density, args.lost_mass
        )
        for _, name, options in runs
    ]

    spardl_call = functools.cache(lambda: spardl_events(MPITransport(comm), source, args.density))

    def floor(error_feedback: bool) -> FloorRun:
        return FloorRun(
            MPITransport(comm), spardl_call(), source.numel, args.density, error_feedback
        )

    factories += [lambda feedback=feedback: floor(feedback) for feedback in FLOORS.values()]
    gradient, chosen = mpi_gradients(comm, source), {}
    factories = noting_choices(runs, factories, chosen, gradient)
    records = time_runs(factories, gradient, args.warmup + args.iters, args.sequential)
    counts = operation_counts(args, runs, lambda count: count(MPITransport(comm)))
    rows = []
    for index, ((label, name, options), run_records) in enumerate(zip(runs + FLOOR_RUNS, records)):
        per_rank = comm.gather(run_records[args.warmup :], root=0)
        if comm.Get_rank() == 0:
            row = dict(
                summarize(label, name, options, per_rank, args, workers, source.numel),
                wire=plan.row_wire(options),
                network=network_label(),
                topology=cluster_topology(),
                threads=threads,
            )
            if name == plan.SPARDL and index < len(runs):
                row.update(spardl_columns(options, chosen.get(index)))
            if index < len(counts):
                row.update(counts[index])
            rows.append(row)
    return rows if comm.Get_rank() == 0 else []


def replay_rows(args) -> list:
    """Time every row's rank 0 alone in this process (``--replay P``, :mod:`syncbench.replay`).

    With a ``teams="auto"`` row and ``--warmup 0`` the recorded call is call 1, not call 0: the
    recorded call of an auto row must come after its choice.
    """
    source = args.source
    runs = runs_to_time(args, args.replay, speaks=True)
    # A teams="auto" row chooses in its first sparse call: record a later one, so that the
    # replayed call starts from the chosen configuration and does not replay the probe.
    auto = any(options.get("teams") == plan.AUTO for _, _, options in runs)
    recorded = max(args.warmup, 1) if auto else args.warmup
    factories, gradient = replay_runs(runs, source, args.replay, recorded, args.density)
    chosen = {}
    records = time_runs(
        noting_choices(runs, factories, chosen),
        gradient,
        args.warmup + args.iters,
        args.sequential,
    )
    counts = operation_counts(args, runs, lambda count: local_group(args.replay).run(count)[0])
    rows = []
    for index, ((label, name, options), run_records) in enumerate(zip(runs + FLOOR_RUNS, records)):
        row = dict(
            summarize(
                label, name, options, [run_records[args.warmup :]], args, args.replay, source.numel
            ),
            wire=plan.row_wire(options),
            network=network_label(replayed=True),
            topology=None,
            threads=[torch.get_num_threads()],
            device=str(getattr(source, "device", "cpu")),
        )
        if name == plan.SPARDL and index < len(runs):
            row.update(spardl_columns(options, chosen.get(index)))
        if index < len(counts):
            row.update(counts[index])
        rows.append(row)
    return rows
