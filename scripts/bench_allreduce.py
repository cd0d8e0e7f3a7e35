#!/usr/bin/env python
"""Time every synchronization method side by side on the same gradients.

    scripts/run_bench.sh -n 4 --numel 14728266 --density 0.01 --json bench.json
    # the same as: OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1 \
    #              .venv/bin/mpiexec -n 4 .venv/bin/python scripts/bench_allreduce.py ...

Every method (default: all of ``compressors.available()``) synchronizes the same gradients: call
``c`` of rank ``r`` gets ``synthetic_gradient(scale, seed, r, c)`` (heavy tailed, see
``syncbench.gradients.SyntheticGradients``), or with ``--gradient model:NAME`` a real gradient
of that model on a random batch. Per call and rank the script records the wall time of
``sync.allreduce``, its phase split from ``sync.stats``, the traffic and the cosine between the
result and the exact average of the raw gradients of that call (one exact MPI all-reduce,
outside the timing). A call takes as long as its slowest rank, so every time is that of the
call's slowest rank, and so is its split into phases; the table shows the median over the timed
calls (warm-up calls excluded) and the min and max. Every row records the network it ran on
(``network``: ``SPARDL_NETWORK_RATE`` as scripts/shaped_network.sh sets it, else ``loopback``)
and each rank's torch thread count (``threads``).

SparDL gets a row per team count (``--teams``), Spar-Reduce-Scatter execution (``--srs``),
Spar-All-Gather variant (``--sag``) and team layout (``--layout``) that applies at P, labelled
``spardl(d=4,blocks,recursive,strided)`` with what differs from the defaults; a setting that
does not apply is skipped with a note. ``--teams auto`` adds a row ``spardl(d=auto)`` (per
``--srs``) in which SparDL chooses d, the variant and the layout itself by a short probe of the
network when the row is built, outside the timed calls; its JSON row records
``teams_requested: "auto"``, the chosen ``teams``, ``sag`` and ``layout``, and the probe's times
(``auto_probe``).
``--method-option KEY=VALUE`` (repeatable) gives any option of the methods that take it
(``compressors.options``), e.g. ``in_flight=2`` for oktopk, labelled ``oktopk(in_flight=2)``;
every row records its options under ``options``. For spardl, ``teams``, ``srs``, ``sag`` and
``layout`` given so win over ``--teams``, ``--srs``, ``--sag`` and ``--layout``.

``--wire fp32,fp16,bf16`` (comma-separated, default ``fp32``) gives every row once per wire
format of the methods' messages (``allreducers.wire``): fp32 is int32 indices and float32 values
(8 bytes a sparse entry, 4 a dense value), fp16 and bf16 16-bit values and, where that is
smaller, 16-bit index offsets (4 bytes a sparse entry, 6 where indices stay int32, 2 a dense
value, plus 12 + 8L + 8R header bytes a message of L lists and R offset runs). Rows
are labelled ``topk(wire=fp16)`` (fp32 rows as before) and record ``wire`` in the JSON;
``bytes_per_rank`` counts the bytes actually sent. The floor rows replay SparDL's fp32 messages
at every ``--wire``: their ratios compare every wire's rows with the same fp32 reference.

``--numel`` is checked before anything is allocated: against the most entries each method's
int32 indices address, and against this host's available memory.

The methods run interleaved: call c of every row synchronizes the same gradient, one row after
another, starting with a different row each call, so drift of the machine's speed during the run
hits all rows alike (``--sequential`` times one method after another, with one method's buffers in
memory at a time).

The **floor** row replays SparDL's messages (same sizes, partners and rounds, with d = 1) through
the transport with no selection, packing or accumulation, plus one ``Selector.topk`` pass over the
n gradient entries of this rank; ``x floor`` is each method's median over the floor's median.
The **floor+ef** row adds to it the error-feedback work that every method with a residual and a
dense result does (``syncbench.floor``); ``x ef`` is the ratio to its median.

``--replay P`` (no mpiexec) measures one rank's work alone, free of the network and of other ranks
competing for the cores and memory (``syncbench.replay``). Set ``OMP_NUM_THREADS=1`` to time one
rank per core.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_allreduce.py --replay 4 --numel 14728266 \
        --density 0.01
"""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    import torch

    from allreducers.transports.environment import cluster_topology
    from syncbench import cli, plan
    from syncbench.bench import mpi_rows, network_label, replay_rows
    from syncbench.floor import EF_FLOOR, FLOOR
    from syncbench.gradients import OnDevice, gradient_source
    from syncbench.summary import format_table, plot, write_csv
except ModuleNotFoundError as missing:
    if missing.name not in ("compressors", "allreducers", "syncbench"):
        raise
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
        print(
            f"bench_allreduce.py: the package {missing.name!r} is not installed: run "
            "`pip install -e .` in the repository first",
            file=sys.stderr,
        )
    sys.exit(2)


#: The end of a flag's help that names its default.
DEFAULT = " (default: %(default)s)"


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring and docs/PERFORMANCE.md#how-to-measure)."""
    parser = cli.RankZeroParser(
        prog="bench_allreduce.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Two reference rows follow the methods: 'floor' (SparDL's messages with no method "
        "work,\nplus one top-k pass over n) and 'floor+ef' (the floor plus the error-feedback work "
        "of a\n"
        "method with a residual and a dense result); 'x floor' and 'x ef' are each row's median\n"
        "over theirs. Under mpiexec, use scripts/run_bench.sh -n P, which sets one thread per\n"
        "rank and MPICH's yield variables.",
    )
    add_method_args(parser)
    add_gradient_args(parser)
    add_run_args(parser)
    args = parser.parse_args(argv)
    check_method_args(parser, args)
    check_run_args(parser, args)
    return args


def add_method_args(parser) -> None:
    """The flags of n, the density, the methods and their options, the calls and the seed."""
    parser.add_argument(
        "--numel", type=int, default=1 << 20, help="gradient length n, synthetic" + DEFAULT
    )
    parser.add_argument(
        "--density", type=float, default=0.01, help="fraction of entries kept, in (0, 1]" + DEFAULT
    )
    parser.add_argument(
        "--methods", default="all", help="comma-separated names, or 'all' (the default)"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed calls per method" + DEFAULT)
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed calls per method first" + DEFAULT
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the gradients and model weights" + DEFAULT
    )
    parser.add_argument(
        "--teams",
        default="1",
        help="spardl team counts d, comma-separated; 'auto': spardl chooses d, its "
        "Spar-All-Gather variant and its layout by a probe at start-up" + DEFAULT,
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
        f"{', '.join(plan.SAG_CHOICES)} (recursive: d > 1 a power of two)" + DEFAULT,
    )
    parser.add_argument(
        "--layout",
        default=plan.LAYOUT_DEFAULT,
        help="spardl team layouts, comma-separated: block (consecutive ranks: with ranks "
        "placed host by host, a team can be a host's ranks) or strided (every d-th rank: the "
        "ranks of one local index across the hosts)" + DEFAULT,
    )
    parser.add_argument(
        "--wire",
        default=plan.WIRE_DEFAULT,
        help="wire formats of every method's messages, comma-separated: "
        f"{', '.join(plan.WIRES)} (a row per method and wire)" + DEFAULT,
    )
    parser.add_argument(
        "--method-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the methods that take it (repeatable), converted to the type of "
        "its default, e.g. in_flight=2 (oktopk); a key no method of --methods takes is an "
        "error; spardl's teams, srs, sag and layout given so win over --teams, --srs, --sag "
        "and --layout, and wire over --wire",
    )
    parser.add_argument(
        "--lost-mass",
        action="store_true",
        help="record the lost mass of methods that measure it (gtopk), measured "
        "after each timed call, outside its time",
    )


def add_gradient_args(parser) -> None:
    """The flags of the gradients: synthetic or a model's."""
    parser.add_argument(
        "--gradient", default="synthetic", help="'synthetic' (the default) or 'model:NAME'"
    )
    parser.add_argument(
        "--batch", type=int, default=8, help="batch size for model gradients" + DEFAULT
    )
    parser.add_argument(
        "--input-shape", default="3,32,32", help="C,H,W for model gradients" + DEFAULT
    )
    parser.add_argument(
        "--classes", type=int, default=10, help="classes for model gradients" + DEFAULT
    )


def add_run_args(parser) -> None:
    """The flags of how the methods run (interleaved, replayed, counted) and of the outputs."""
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="time all calls of one method before the next (less memory: one "
        "method's buffers at a time) instead of interleaving the methods call "
        "by call (the default: drift of the machine's speed hits all alike)",
    )
    parser.add_argument(
        "--replay",
        type=int,
        metavar="P",
        help="no mpiexec: record each method's call on P in-process ranks and time "
        "rank 0's share of it alone in this process, its messages played back "
        "(the compute cost per rank, free of network and oversubscription)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the gradients and the methods' work live; cuda: with --replay, one rank's "
        "local work on the GPU (each timed call waits for the device before the clock stops; "
        "--count-ops then also counts host synchronizations, host_sync_ops)" + DEFAULT,
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="add to each row the torch operations one call dispatches on rank 0 (ops), "
        "those that are not views (working_ops: on a GPU each launches work) and how many "
        "read data-dependent sizes (data_dependent_ops): a fresh "
        "synchronizer's second call, after the timed calls (syncbench.opcount)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write a chart of times and bytes (FILE.png; or .pdf, .svg, ...)",
    )


def check_method_args(parser, args) -> None:
    """Check and convert the methods, their SparDL settings, wires and options (usage errors)."""
    args.methods = cli.usage_checked(parser, cli.method_names, args.methods)
    args.teams = cli.usage_checked(parser, cli.team_counts, args.teams, "--teams")
    args.srs = cli.usage_checked(parser, cli.choices, args.srs, "--srs", plan.SRS_CHOICES)
    args.sag = cli.usage_checked(parser, cli.choices, args.sag, "--sag", plan.SAG_CHOICES)
    args.layout = cli.usage_checked(
        parser, cli.choices, args.layout, "--layout", plan.LAYOUT_CHOICES
    )
    args.wire = cli.usage_checked(parser, cli.choices, args.wire, "--wire", plan.WIRES)
    args.options = cli.usage_checked(parser, cli.method_options, args.method_option, args.methods)
    swept = args.options.get(plan.SPARDL, {})
    for key in plan.SWEPT:  # --method-option teams=2 wins over --teams
        if key in swept:
            setattr(args, key, [swept.pop(key)])
    for chosen in args.options.values():  # --method-option wire=fp16 wins over --wire
        if "wire" in chosen:
            args.wire = (chosen.pop("wire"),)


def check_run_args(parser, args) -> None:
    """Check the density, the counts, the seed, the outputs and n, and build ``args.source``."""
    cli.usage_checked(parser, cli.check_density, args.density)
    for flag, value, least in (
        ("--iters", args.iters, 1),
        ("--warmup", args.warmup, 0),
        ("--replay", args.replay, 1),
    ):
        if value is not None and value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    if args.replay and cli.launched_rank_and_size()[1] > 1:
        parser.error("--replay times one process alone: start it without mpiexec")
    if args.device == "cuda" and not args.replay:
        parser.error("--device cuda times one rank's local work: it needs --replay P")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available to this process")
    if args.replay and args.lost_mass:
        parser.error("--lost-mass needs the ranks' exchange: it does not go with --replay")
    cli.usage_checked(parser, cli.check_seed, args.seed)
    cli.usage_checked(parser, cluster_topology)
    for flag in ("json", "csv"):
        if getattr(args, flag):
            cli.usage_checked(parser, cli.output_file, getattr(args, flag), f"--{flag}")
    if args.plot:
        cli.usage_checked(parser, cli.plot_file, args.plot)
    if args.gradient == "synthetic":  # a model's n is known once it is built, below
        cli.usage_checked(parser, cli.check_numel, args.numel, args.methods, buffers(args))
    args.source = cli.usage_checked(
        parser,
        gradient_source,
        args.gradient,
        args.numel,
        args.seed,
        args.batch,
        args.input_shape,
        args.classes,
    )
    if args.gradient != "synthetic":
        cli.usage_checked(
            parser, cli.check_numel, args.source.numel, args.methods, buffers(args), "the model's n"
        )
    if args.device != "cpu":
        args.source = OnDevice(args.source, torch.device(args.device))


def buffers(args) -> int:
    """The float32 buffers of n entries that a run holds at once on this host, at least.

    Under MPI, per rank: the synthetic gradients' scale, the gradient, its exact average, the
    result, and a residual per method held at once (all of them interleaved, one with
    ``--sequential``). A replay records each method on P in-process ranks: P gradients per
    recorded call (the warm-up calls and one) and P residuals.
    """
    if args.replay:
        return args.replay * (args.warmup + 2) + 3
    held = 1 if args.sequential else len(args.methods) * len(args.wire)
    return cli.local_ranks() * (4 + held)


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
    threads = rows[0]["threads"]
    if args.replay:
        print(
            f"rank 0 of a {args.replay}-rank call, replayed alone in one process "
            f"({threads[0]} torch thread(s), no network, no other rank):"
        )
    else:
        print(f"network: {network_label()}; torch threads per rank: {min(threads)}-{max(threads)}")
    print(format_table(rows), flush=True)
    for row in rows:
        if row.get("teams_requested") == plan.AUTO:
            print(
                f"{row['label']} chose d={row['teams']}, {row['sag']}, {row['layout']} "
                f"(probe {row['auto_seconds'] or 0:.1f} s, per candidate in the JSON's auto_probe)"
            )
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
