#!/usr/bin/env python
"""Predict synchronization time at scale from the real methods run on the in-process group.

    .venv/bin/python scripts/simulate.py --workers 16,32,64,128,256 --plot sim.png --json sim.json
    .venv/bin/python scripts/simulate.py --workers 4,8 --network shared:1gbit,shared:10gbit
    .venv/bin/python scripts/simulate.py --compare bench.json      # predicted beside measured
    .venv/bin/python scripts/simulate.py --compare bench.json --local-work replay --host-cores 2

Every method runs for real on P threads of one process at a modest n (``--numel``, 2^18 by
default; the model: ``syncbench.simulator``), and its messages and selections are priced by a
network model and a selection rate, then scaled to ``--model-numel``.

Networks (``--network``, comma-separated): ``ethernet`` (10 Gb/s: alpha 25 us, beta 1/1.25e9 s/B
per rank) and ``infiniband`` (100 Gb/s: alpha 1.5 us, beta 1/12.5e9 s/B per rank), alpha-beta
models where every rank has its own link; ``shared:RATE`` (e.g. ``shared:1gbit``), this
project's testbed: all ranks on one host sharing ONE link of RATE (tc's units), so a round costs
``--message-cost`` times the busiest rank's messages plus the bytes of all ranks over RATE, and
with ``--host-cores N`` the ranks also share N cores (``syncbench.network``);
``--alpha``/``--beta`` add a ``custom`` alpha-beta network.

Selection: a fixed ``--select-rate`` in entries per second (default 1e9, the same on every
machine, so that tables are reproducible), or ``--select-rate measured`` to time this
machine's selector (``--select-threads``, ``--select-device``); the output states the rate used.

Local work: ``--local-work select`` (the default) adds the selection alone to the network time;
``--local-work replay`` adds each rank's whole local work instead (selection, accumulation,
packing, scatter-adds, copies), rank 0's share of each call timed alone in this process with its
messages played back, at the simulated n (or ``--local-numel``) and a quarter of it, fitted as
fixed + per-entry seconds and evaluated at ``--model-numel`` (``syncbench.local_work``; it
depends on this machine). The output states which was used; rows carry ``local_ms``.

``--wire fp32,fp16,bf16`` (comma-separated, default ``fp32``) runs every row once per wire
format of the methods' messages, labelled ``topk(wire=fp16)``, rows keyed ``wire``: the bytes
are those the real methods send (``allreducers.wire``): per sparse entry 8 at fp32 (int32 index,
float32 value), 4 at fp16 or bf16 where indices travel as 16-bit offsets (6 where they stay
int32); per dense value 4 or 2; plus 12 + 8L + 8R header bytes a 16-bit message of L lists and
R offset runs.

A cluster of hosts (scripts/cluster_network.sh; docs/CLUSTER.md): ``--topology JSON`` (what
``SPARDL_CLUSTER`` holds: ``{"hosts": 4, "ranks_per_host": 1, "rates": ["1gbit", ...]}``) or
``--hosts N --ranks-per-host G --rates R1,...,RN`` (one rate: every host's; without ``--hosts``,
as many hosts as each P fills) adds a network where rank r is on host r // G, each message is
charged on its sender host's uplink and its receiver host's downlink (messages sharing a link in
a round share its rate), at ``--message-cost`` each, and messages within a host cost
``--shm-cost`` each plus their bytes at ``--shm-rate`` (``syncbench.network.Cluster``).

``--compare FILE ...`` reads benchmark JSON files (``scripts/bench_allreduce.py --json``) and
predicts every method row at its own P, n, density, SparDL settings and wire on the network it
ran on (a row with a ``topology``, run on the cluster testbed, on that cluster; a shaped rate
recorded in its ``network`` becomes ``shared:RATE``; ``--network`` or a topology replaces it),
printing measured ms, predicted ms and the error in percent.

The sizes are checked before anything is allocated: every row runs its P ranks as threads of
this process and holds at least 3P + 1 float32 buffers of the simulated n at once (the
gradients' scale, and each rank's gradient, residual and result;
``syncbench.simulator.held_buffers``), at ``--numel`` rounded up per P, at the larger
``--local-numel`` size of ``--local-work replay``, and with ``--compare`` at each row's own P
and n. A run that needs more than this host's available memory is refused with one line and
exit status 2 rather than killed by the kernel part way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

try:
    import torch

    from syncbench import cli, plan, predictions
    from syncbench.compare import compare, format_comparison, load_bench_rows
    from syncbench.local_work import MODES as LOCAL_WORK_MODES
    from syncbench.local_work import ReplayedLocalWork, describe_select
    from syncbench.network import (
        PRESETS,
        SHM_ALPHA,
        SHM_RATE,
        TESTBED_ALPHA,
        Network,
        cluster_network,
        parse_network,
        parse_rate,
    )
    from syncbench.selection_cost import DEFAULT_SELECT_RATE, SelectionCost
    from syncbench.simulator import VGG16_NUMEL, held_buffers, simulate_row, simulated_numel
except ModuleNotFoundError as missing:
    if missing.name not in ("compressors", "allreducers", "syncbench"):
        raise
    print(
        f"simulate.py: the package {missing.name!r} is not installed: run `pip install -e .` "
        "in the repository first",
        file=sys.stderr,
    )
    sys.exit(2)


def select_rate(text: str):
    """``--select-rate``: entries per second, ``None`` for ``measured``; else ``ValueError``."""
    if text == "measured":
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0 < rate < math.inf:
        raise ValueError(
            f"--select-rate must be a positive number of entries/s or 'measured', got {text!r}"
        )
    return rate


def networks(text: str, message_cost: float, cores) -> list:
    """The models named by ``--network`` (:func:`syncbench.network.parse_network`), once each."""
    return [
        parse_network(spec, message_cost, cores) for spec in dict.fromkeys(text.split(",")) if spec
    ]


#: The end of a flag's help that names its default.
DEFAULT = " (default: %(default)s)"


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring and docs/PERFORMANCE.md#how-to-measure)."""
    parser = cli.RankZeroParser(
        prog="simulate.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(parser)
    add_network_args(parser)
    add_local_work_args(parser)
    add_output_args(parser)
    args = parser.parse_args(argv)
    check_run_args(parser, args)
    check_network_args(parser, args)
    check_count_args(parser, args)
    check_local_work_args(parser, args)
    check_output_args(parser, args)
    cli.usage_checked(parser, check_memory, args)
    return args


def add_run_args(parser) -> None:
    """The flags of what runs: P, n, density, methods and their SparDL settings, calls, seed."""
    parser.add_argument(
        "--workers", default="16,32,64,128,256", help="P values, comma-separated" + DEFAULT
    )
    parser.add_argument(
        "--numel",
        type=int,
        default=1 << 18,
        help="simulated gradient length, rounded up per P so that every SparDL block "
        "keeps its share of the density" + DEFAULT,
    )
    parser.add_argument(
        "--model-numel",
        type=int,
        default=VGG16_NUMEL,
        help="n the predictions scale to (default: %(default)s, VGG-16)",
    )
    parser.add_argument(
        "--density", type=float, default=0.01, help="fraction of entries kept, in (0, 1]" + DEFAULT
    )
    parser.add_argument(
        "--methods", default="all", help="comma-separated names, or 'all' (the default)"
    )
    parser.add_argument(
        "--teams",
        default="1",
        help="spardl team counts d in the main table, comma-separated" + DEFAULT,
    )
    parser.add_argument(
        "--srs",
        default=plan.SRS_DEFAULT,
        help="spardl Spar-Reduce-Scatter executions, comma-separated: "
        f"{', '.join(plan.SRS_CHOICES)}" + DEFAULT,
    )
    parser.add_argument(
        "--sag",
        default=plan.SAG_DEFAULT,
        help="spardl Spar-All-Gather variants, comma-separated: "
        f"{', '.join(plan.SAG_CHOICES)}" + DEFAULT,
    )
    parser.add_argument(
        "--wire",
        default=plan.WIRE_DEFAULT,
        help=f"wire formats of the methods' messages, comma-separated: {', '.join(plan.WIRES)} "
        "(a row per method and wire; bytes per sparse entry: fp32 8, fp16 and bf16 4, or 6 "
        "where indices stay int32, plus a small header per message)" + DEFAULT,
    )
    parser.add_argument(
        "--sweep",
        default="",
        help="P values at which to sweep spardl over every team count d dividing P (default: none)",
    )
    parser.add_argument("--calls", type=int, default=1, help="modelled calls per method" + DEFAULT)
    parser.add_argument("--warmup", type=int, default=1, help="calls run before them" + DEFAULT)
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradients" + DEFAULT)


def add_network_args(parser) -> None:
    """The flags of the networks: presets, the testbed's shared link, a cluster, a custom one."""
    parser.add_argument(
        "--network",
        help=f"networks, comma-separated: {', '.join(PRESETS)}, or shared:RATE (this testbed: "
        f"one link of RATE, e.g. shared:1gbit, shared by all ranks) (default: "
        f"{','.join(PRESETS)}; with --compare, each row's own)",
    )
    parser.add_argument(
        "--message-cost",
        type=float,
        default=TESTBED_ALPHA,
        help="seconds per message of shared:RATE networks" + DEFAULT,
    )
    parser.add_argument(
        "--host-cores",
        type=int,
        help="cores the ranks of shared:RATE networks share; their selections take "
        "max(1, P / cores) times as long (default: a core per rank)",
    )
    parser.add_argument(
        "--topology",
        metavar="JSON",
        help="a cluster of hosts as SPARDL_CLUSTER writes it, e.g. "
        '\'{"hosts": 4, "ranks_per_host": 1, "rates": ["1gbit", "1gbit", "1gbit", "1gbit"]}\' '
        "(with --compare: instead of each row's own)",
    )
    parser.add_argument("--hosts", type=int, help="hosts of a cluster (with --rates)")
    parser.add_argument(
        "--ranks-per-host",
        type=int,
        help="ranks on each host of a cluster: rank r on host r // G (with --rates; default 1)",
    )
    parser.add_argument(
        "--rates",
        help="link rate of each host of a cluster, comma-separated, or one for all, in tc's "
        "units (e.g. 100mbit,1gbit,1gbit,1gbit); without --hosts, as many hosts as P fills",
    )
    parser.add_argument(
        "--shm-cost",
        type=float,
        default=SHM_ALPHA,
        help="seconds per message between ranks of one host of a cluster" + DEFAULT,
    )
    parser.add_argument(
        "--shm-rate",
        default=f"{SHM_RATE:g}bps",
        help="bytes/s between ranks of one host of a cluster, in tc's units" + DEFAULT,
    )
    parser.add_argument(
        "--alpha",
        type=float,
        help="latency per message in seconds of a custom network (with --beta)",
    )
    parser.add_argument(
        "--beta", type=float, help="seconds per byte of a custom network (with --alpha)"
    )


def add_local_work_args(parser) -> None:
    """The flags of the local work: the selection rate, or the replayed local work."""
    parser.add_argument(
        "--select-rate",
        default=f"{DEFAULT_SELECT_RATE:g}",
        help="selection throughput in entries/s, the same for every kind of selection, or "
        "'measured': timed on this machine" + DEFAULT,
    )
    parser.add_argument(
        "--select-threads",
        type=int,
        default=1,
        help="threads of the selection timing (--select-rate measured)" + DEFAULT,
    )
    parser.add_argument(
        "--select-device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where to time selection (--select-rate measured)" + DEFAULT,
    )
    parser.add_argument(
        "--local-work",
        default="select",
        metavar="MODEL",
        help="each rank's local work added to the network time: 'select' (selection "
        "alone, at --select-rate) or 'replay' (rank 0's whole share of each call "
        "replayed alone on this machine at two sizes, fitted fixed + per entry)" + DEFAULT,
    )
    parser.add_argument(
        "--local-numel",
        type=int,
        help="the larger replay size of --local-work replay, the smaller being a quarter "
        "of it (default: the simulated n; with --compare at most each row's n)",
    )


def add_output_args(parser) -> None:
    """The flags of the inputs compared with and the outputs written."""
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="BENCH_JSON",
        help="predict every method row of these benchmark JSON files and print "
        "measured beside predicted (--workers, --methods, --teams, --sweep unused)",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="write every row as a JSON list (key 'table': 'methods', 'sweep' or 'compare')",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write a chart of predicted time against P, and against d with --sweep "
        "(FILE.png; or .pdf, .svg, ...)",
    )


def check_run_args(parser, args) -> None:
    """Check and convert the lists of :func:`add_run_args` and the density (usage errors)."""
    args.methods = cli.usage_checked(parser, cli.method_names, args.methods)
    args.workers = cli.usage_checked(parser, cli.positive_ints, args.workers, "--workers")
    args.teams = cli.usage_checked(parser, cli.positive_ints, args.teams, "--teams")
    args.srs = cli.usage_checked(parser, cli.choices, args.srs, "--srs", plan.SRS_CHOICES)
    args.sag = cli.usage_checked(parser, cli.choices, args.sag, "--sag", plan.SAG_CHOICES)
    args.wire = cli.usage_checked(parser, cli.choices, args.wire, "--wire", plan.WIRES)
    args.sweep = (
        cli.usage_checked(parser, cli.positive_ints, args.sweep, "--sweep") if args.sweep else []
    )
    cli.usage_checked(parser, cli.check_density, args.density)


def check_network_args(parser, args) -> None:
    """Check the shared-link flags and build ``args.networks`` and ``args.cluster``."""
    if not 0 <= args.message_cost < math.inf:
        parser.error(
            f"--message-cost must be a finite number of seconds >= 0, got {args.message_cost:g}"
        )
    if args.host_cores is not None and args.host_cores < 1:
        parser.error(f"--host-cores must be >= 1, got {args.host_cores}")
    args.cluster = cluster_args(parser, args)
    default_networks = ",".join(PRESETS) if not (args.compare or args.cluster) else ""
    args.networks = cli.usage_checked(
        parser, networks, args.network or default_networks, args.message_cost, args.host_cores
    )
    if args.cluster:
        args.networks.append(args.cluster)


def check_count_args(parser, args) -> None:
    """Check the device, the sizes, the custom network and the call counts (usage errors)."""
    if args.select_device == "cuda" and not torch.cuda.is_available():
        parser.error("--select-device cuda: no CUDA device here")
    for flag, value in (("--numel", args.numel), ("--model-numel", args.model_numel)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if (args.alpha is None) != (args.beta is None):
        parser.error("--alpha and --beta go together")
    if args.alpha is not None:
        if not (
            0 <= args.alpha < math.inf and 0 <= args.beta < math.inf and args.alpha + args.beta > 0
        ):
            parser.error(
                "--alpha and --beta must be finite, >= 0 and not both 0, got "
                f"{args.alpha:g} and {args.beta:g}"
            )
        args.networks.append(Network("custom", args.alpha, args.beta))
    for flag, value, least in (("--calls", args.calls, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    if not (args.networks or args.compare):
        parser.error("--network names no network: give at least one")


def check_local_work_args(parser, args) -> None:
    """Check the flags of :func:`add_local_work_args` (usage errors)."""
    if args.select_threads < 1:
        parser.error(f"--select-threads must be >= 1, got {args.select_threads}")
    args.select_rate = cli.usage_checked(parser, select_rate, args.select_rate)
    if args.local_work not in LOCAL_WORK_MODES:
        parser.error(
            f"--local-work must be one of {', '.join(LOCAL_WORK_MODES)}, got {args.local_work!r}"
        )
    if args.local_numel is not None and (args.local_work != "replay" or args.local_numel < 1):
        parser.error(
            f"--local-numel must be >= 1 and goes with --local-work replay, got {args.local_numel} "
            f"with --local-work {args.local_work}"
        )


def check_output_args(parser, args) -> None:
    """Check the seed and the output files, and read the ``--compare`` rows (usage errors)."""
    cli.usage_checked(parser, cli.check_seed, args.seed)
    if args.json:
        cli.usage_checked(parser, cli.output_file, args.json, "--json")
    if args.plot:
        cli.usage_checked(parser, cli.plot_file, args.plot)
    args.bench_rows = [
        row
        for path in args.compare or []
        for row in cli.usage_checked(parser, load_bench_rows, path)
    ]


def check_memory(args) -> None:
    """``ValueError`` if a simulation would need more memory than this host has available.

    Every row runs its P ranks as threads of this process at the simulated n (at a row's own P
    and n with ``--compare``; with ``--local-work replay`` also at the larger replay size), so it
    holds at least :func:`syncbench.simulator.held_buffers` float32 buffers of n entries at once.
    Checked before anything is allocated: such a run would otherwise be killed by the kernel.
    """
    for workers, numel, given, advice in planned_sizes(args):
        buffers, available = held_buffers(workers), cli.available_memory()
        needed = 4 * numel * buffers
        if available is not None and needed > available:
            raise ValueError(
                f"{given} needs at least {needed / 1e9:.1f} GB of memory on this host to "
                f"simulate P={workers} ({buffers} float32 buffers of the simulated n={numel:,}: "
                "the gradients' scale and each rank's gradient, residual and result), more than "
                f"the {available / 1e9:.1f} GB available; use {advice}"
            )


def planned_sizes(args) -> list:
    """``(P, n, given, advice)`` for every P and simulated n the run would allocate at.

    ``given`` names the flag or row that chose n, ``advice`` what to change.
    """
    replay = args.local_work == "replay"
    if not args.compare:
        sizes = []
        for workers in dict.fromkeys(args.workers + args.sweep):
            flag = "--workers" if workers in args.workers else "--sweep"
            advice = f"a smaller --numel or a smaller P in {flag}"
            numel = simulated_numel(args.numel, workers, args.density)
            sizes.append((workers, numel, f"--numel {args.numel}", advice))
            if replay and args.local_numel:
                larger = min(args.local_numel, args.model_numel)
                numel = simulated_numel(larger, workers, args.density)
                advice = f"a smaller --local-numel or a smaller P in {flag}"
                sizes.append((workers, numel, f"--local-numel {args.local_numel}", advice))
        return sizes
    sizes = []
    for row in args.bench_rows:
        try:
            workers, density = int(row["workers"]), float(row["density"])
            numel = simulated_numel(min(args.numel, row["numel"]), workers, density)
            larger = min(args.local_numel, row["numel"]) if replay and args.local_numel else 0
            numel = max(numel, simulated_numel(larger, workers, density) if larger else 0)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            continue  # not a size: the row's simulation reports it
        given = f"--compare: the row {row['label']} at P={workers}"
        sizes.append((workers, numel, given, "a smaller --numel or --local-numel"))
    return sizes


def cluster_args(parser, args):
    """The cluster of ``--topology`` or ``--hosts``/``--ranks-per-host``/``--rates``, or ``None``.

    Also checks ``--shm-cost`` and ``--shm-rate`` (turned into bytes/s); usage errors exit 2.
    """
    if not 0 <= args.shm_cost < math.inf:
        parser.error(f"--shm-cost must be a finite number of seconds >= 0, got {args.shm_cost:g}")
    args.shm_rate = cli.usage_checked(parser, parse_rate, args.shm_rate)
    layout = args.hosts is not None or args.ranks_per_host is not None or args.rates is not None
    if args.topology is not None and layout:
        parser.error("--topology and --hosts/--ranks-per-host/--rates: give one of them")
    if layout and args.rates is None:
        parser.error("--hosts and --ranks-per-host need --rates")
    if args.topology is not None:
        topology = args.topology
    elif layout:
        rates = args.rates.split(",")
        topology = {
            "hosts": args.hosts,
            "ranks_per_host": 1 if args.ranks_per_host is None else args.ranks_per_host,
            "rates": rates,
        }
        if args.hosts is None and len(rates) > 1:
            parser.error(f"--rates gives {len(rates)} rates: give --hosts too (one rate a host)")
    else:
        return None
    return cli.usage_checked(
        parser, row_cluster, topology, args.message_cost, args.host_cores, args
    )


def row_cluster(topology, message_cost, cores, args):
    """The :class:`syncbench.network.Cluster` of ``topology`` with the shared-memory flags."""
    try:
        return cluster_network(topology, message_cost, cores, args.shm_cost, args.shm_rate)
    except ValueError as error:
        raise ValueError(f"cluster: {error}") from None


def selection_cost(args) -> SelectionCost:
    """The selection cost the predictions use (``--select-rate``), its line printed."""
    cost = SelectionCost(
        args.density, args.select_threads, args.select_rate, args.seed, device=args.select_device
    )
    where = (
        "a GPU"
        if args.select_device != "cpu"
        else f"this machine's CPU ({args.select_threads} threads)"
    )
    print(cost.describe(where), flush=True)
    return cost


def local_work(args):
    """The local-work model (``--local-work``): a ``ReplayedLocalWork``, or ``None`` for selection
    only; its line printed."""
    model = ReplayedLocalWork(args.local_numel) if args.local_work == "replay" else None
    print(describe_select() if model is None else model.describe(), flush=True)
    return model


def main_compare(args) -> list:
    """``--compare``: predicted beside measured for every benchmark row; returns the rows."""
    cost, local = selection_cost(args), local_work(args)
    print(
        f"message cost: {args.message_cost * 1e6:.1f} us per message (--message-cost)", flush=True
    )
    try:
        rows = []
        for row in args.bench_rows:
            given = args.networks or None
            if given is None and row.get("topology"):
                given = [row_cluster(row["topology"], args.message_cost, args.host_cores, args)]
            rows += compare([row], args, cost, given, args.message_cost, args.host_cores, local)
    except ValueError as error:
        print(f"simulate.py: {error}", file=sys.stderr)
        sys.exit(2)
    print(format_comparison(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                [dict(r, table="compare", message_cost_s=args.message_cost) for r in rows],
                handle,
                indent=1,
            )
    return rows


def main(argv=None) -> tuple:
    """Simulate, print the tables and crossovers, write JSON/plot; returns (rows, sweep rows),
    or with ``--compare`` (comparison rows, [])."""
    args = parse_args(argv)
    if args.compare:
        return main_compare(args), []
    runs = planned_runs(args)
    cost = selection_cost(args)
    local = local_work(args)
    rows, sweep = [], []
    for workers, (label, name, options) in runs:
        rows += simulate_row(label, name, options, workers, args, args.networks, cost, local)
    for workers in args.sweep:
        for teams in (d for d in range(1, workers + 1) if workers % d == 0):
            for wire in args.wire:
                options = (
                    {"teams": teams}
                    if wire == plan.WIRE_DEFAULT
                    else {"teams": teams, "wire": wire}
                )
                sweep += simulate_row(
                    plan.label(plan.SPARDL, options),
                    plan.SPARDL,
                    options,
                    workers,
                    args,
                    args.networks,
                    cost,
                    local,
                )
    print_tables(rows, sweep, args.networks, local)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                [dict(r, table="methods") for r in rows] + [dict(r, table="sweep") for r in sweep],
                handle,
                indent=1,
            )
    if args.plot:
        predictions.plot(rows, sweep, args.plot)
    return rows, sweep


def planned_runs(args) -> list:
    """``(P, (label, method, options))`` of every row of the main table, its notes printed.

    Exits with status 2 when nothing is to be simulated (no row and no ``--sweep``).
    """
    runs = []
    for workers in args.workers:
        for note in plan.skipped(args.methods, args.teams, workers, args.sag):
            print(f"note: {note}", file=sys.stderr)
        runs += [
            (workers, run)
            for run in plan.method_runs(
                args.methods, args.teams, workers, args.srs, args.sag, wires=args.wire
            )
        ]
    if not runs and not args.sweep:
        print(
            "simulate.py: nothing to simulate: no method runs at any P (see the notes above)",
            file=sys.stderr,
        )
        sys.exit(2)
    return runs


def print_tables(rows: list, sweep: list, networks: list, local) -> None:
    """Print the predicted tables (time, network, local work), the crossovers and the sweep."""
    models = {network.name: network.describe() for network in networks}
    terms, left_out = (
        ("selection", "selection") if local is None else ("replayed local work", "local work")
    )
    if rows:
        print(
            predictions.format_tables(
                rows, "predicted_ms", f"predicted ms per call (network + {terms})", models
            )
        )
        print(
            predictions.format_tables(
                rows, "network_ms", f"network ms per call ({left_out} excluded)", models
            )
        )
        if local is not None:
            print(
                predictions.format_tables(
                    rows,
                    "local_ms",
                    "local work ms per call (replayed, times the compute share)",
                    models,
                )
            )
        references = dict.fromkeys(
            r["label"] for r in rows if r["method"] == plan.SPARDL
        )  # every team count
        print(
            "\n"
            + "\n".join(
                line for reference in references for line in predictions.crossovers(rows, reference)
            )
        )
    if sweep:
        print(
            predictions.format_tables(
                sweep,
                "predicted_ms",
                "spardl against the team count d, predicted ms per call",
                models,
            )
        )


if __name__ == "__main__":
    main()
