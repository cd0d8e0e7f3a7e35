"""The trainer's command line: its parser, and the checks that run before anything is built.

:func:`parse_settings` parses ``main_trainer.py``'s flags, merges them with the model's config
file (``trainer.config``) and checks everything that is cheap to check, on every rank at once:
bad input raises one ``UsageError`` naming each problem in the terms of its flag. The method's
``KEY=VALUE`` options are converted and checked by the registry (``compressors.parse_option``)
or, for the PyTorch DDP methods, by ``trainer.torch_ddp``. Flags are documented by ``--help``
and in docs/TRAINING.md.
"""

import argparse
import math
import re
import sys
import tempfile
from pathlib import Path

import torch

import compressors
import datasets
import models
from allreducers.transports.environment import cluster_topology
from allreducers.wire import WIRES
from compressors.fsdp import RESIDUAL_DTYPES
from trainer.config import DEFAULTS, ConfigError, config_path, load_config, merge
from trainer.distributed import UsageError, agree
from trainer.sharded import ranks_per_host
from trainer.torch_ddp import METHODS as DDP_METHODS
from trainer.torch_ddp import is_ddp_method
from trainer.torch_ddp import parse_options as parse_ddp_options

DEFAULT_MODEL = "cnn"
DEFAULT_DATA_DIR = "data"
#: The method whose options have flags of their own (--teams, --sag, --srs) and whose choices
#: they offer; the default of --compression.
SPARSE_DEFAULT = "spardl"


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises ``UsageError`` and prints (help) on rank 0 only.

    ``method_flags`` maps each method option that has a flag of its own to that flag
    (``{"teams": "--teams", ...}``); those flags default to None, "not given".
    """

    def __init__(self, rank, **kwargs):
        super().__init__(**kwargs)
        self.rank = rank
        self.method_flags = {}

    def error(self, message):
        raise UsageError(message)

    def print_help(self, file=None):
        if self.rank == 0:
            super().print_help(file)


def _milestones(text):
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated epochs, got {text!r}") from None


def _method_flag(parser, group, key, **kwargs):
    """Add the flag of method option ``key`` to ``group``, default None (not given)."""
    flag = "--" + key.replace("_", "-")
    group.add_argument(flag, default=None, **kwargs)
    parser.method_flags[key] = flag


def build_parser(rank=0):
    """The command-line parser (``rank`` decides who prints help)."""
    parser = _Parser(
        rank,
        prog="main_trainer.py",
        description="Data-parallel training with sparse gradient synchronization "
        "(SparDL and baselines). Run under mpiexec -n N.",
        epilog="Training hyper-parameters default to configs/<dnn>.json; flags "
        "override them. See docs/TRAINING.md.",
    )
    _model_flags(parser.add_argument_group("model and data"))
    _training_flags(parser.add_argument_group("training (defaults: the model's config file)"))
    sync = parser.add_argument_group("gradient synchronization")
    _sync_flags(sync)
    _method_option_flags(parser, sync)
    _overlap_and_sharding_flags(sync)
    _local_flags(parser.add_argument_group("local SGD and DiLoCo (synchronizing less often)"))
    _output_flags(parser.add_argument_group("output and devices"))
    return parser


def _model_flags(model):
    model.add_argument(
        "--dnn",
        default=DEFAULT_MODEL,
        metavar="NAME",
        help=f"model: {', '.join(models.available())} (default: {DEFAULT_MODEL})",
    )
    model.add_argument(
        "--dataset",
        metavar="NAME",
        help=f"data set: {', '.join(datasets.available())} (default: the model's config)",
    )
    model.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"directory holding the data set files (default: ./{DEFAULT_DATA_DIR}; "
        "fashion-mnist is also found in /usr/share/datasets/fashion-mnist); given, it must "
        "exist and not be empty; digits and synthetic-cifar10 read no files and ignore it. "
        "Nothing is ever written inside it (see --cache-dir)",
    )
    model.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where the text data sets keep their tokenised cache (default: "
        f"{datasets.default_cache_dir()}, from $XDG_CACHE_HOME or ~/.cache)",
    )
    model.add_argument(
        "--download",
        action="store_true",
        help="download a missing data set (cifar10, cifar100, mnist, fashion-mnist) "
        "into --data-dir first (rank 0; needs the internet)",
    )
    model.add_argument(
        "--config",
        metavar="FILE",
        help="config file of training defaults (default: configs/<dnn>.json)",
    )


def _training_flags(training):
    training.add_argument(
        "--batch-size", type=int, metavar="B", help="samples per worker per iteration"
    )
    training.add_argument(
        "--lr", type=float, metavar="LR", help="base learning rate, reached after warm-up"
    )
    training.add_argument("--max-epochs", type=int, metavar="E", help="epochs to train")
    training.add_argument(
        "--max-iters",
        type=int,
        metavar="I",
        help="at most this many iterations per epoch: each epoch's first I batches of its own "
        "shuffle (quick runs; default: all, one pass over the data); for evaluations within a "
        "full epoch use --eval-every",
    )
    training.add_argument(
        "--eval-every",
        type=int,
        metavar="I",
        default=0,
        help="also evaluate (and log a row) after every I-th iteration of the run within an "
        "epoch; it does not change training: the same batches, the same weights (default 0: "
        "after each epoch only)",
    )
    training.add_argument(
        "--warmup-epochs",
        type=float,
        metavar="E",
        help="epochs of linear learning-rate warm-up from lr/N to lr",
    )
    training.add_argument(
        "--lr-milestones",
        type=_milestones,
        metavar="E1,E2,..",
        help="comma-separated epochs (0-based) at whose start the learning rate "
        "is multiplied by --lr-gamma, e.g. 81,122,155; '' for none",
    )
    training.add_argument("--lr-gamma", type=float, metavar="G", help="learning-rate decay factor")
    training.add_argument("--momentum", type=float, metavar="M", help="SGD momentum")
    training.add_argument("--weight-decay", type=float, metavar="W", help="SGD weight decay")
    training.add_argument(
        "--eval-batch-size", type=int, metavar="B", help="samples per worker per test batch"
    )
    training.add_argument(
        "--loader-workers",
        type=int,
        metavar="K",
        help="data-loading worker processes per rank (at most the CPUs it may use)",
    )
    training.add_argument(
        "--clip-grad-norm",
        type=float,
        metavar="C",
        help="clip each worker's gradient to L2 norm C before synchronizing; 0: off",
    )
    training.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="seed of weights, shuffling and augmentation (default: 0)",
    )


def _sync_flags(sync):
    """The method and its density."""
    sync.add_argument(
        "--nworkers",
        type=int,
        metavar="N",
        help="number of workers; must equal the MPI size (default: the MPI size)",
    )
    sync.add_argument(
        "--compression",
        action="store_true",
        help="synchronize sparsely with --compressor (without it: dense)",
    )
    sync.add_argument(
        "--compressor",
        metavar="NAME",
        help=f"method: {', '.join(compressors.available())} (default with --compression: "
        f"spardl); or a PyTorch DDP method, with or without --compression: "
        f"{', '.join(DDP_METHODS)}",
    )
    sync.add_argument(
        "--method",
        metavar="NAME",
        help="the synchronization method in one flag: a registered one (--method spardl is "
        "--compression --compressor spardl; dense) or a PyTorch DDP one: ddp (DDP's own "
        "overlapped all-reduce), ddp_fp16, ddp_bf16 (torch's 16-bit compression hooks), "
        "powersgd (torch's PowerSGD hook; --method-option rank=R, start_iter=I)",
    )
    sync.add_argument(
        "--density",
        type=float,
        default=0.01,
        metavar="D",
        help="fraction of gradient entries kept, in (0, 1] (default: 0.01)",
    )


def _method_option_flags(parser, sync):
    """The method's options: a flag for each of SparDL's, and --method-option for any."""
    defaults, choices = (
        compressors.option_defaults(SPARSE_DEFAULT),
        compressors.option_choices(SPARSE_DEFAULT),
    )
    _method_flag(
        parser,
        sync,
        "teams",
        type=compressors.teams.team_count,
        metavar="d",
        help=f"{SPARSE_DEFAULT}: teams d for Spar-All-Gather, a divisor of N, or auto (chosen "
        "with the SAG variant and layout by a probe at the first step); every method "
        f"checks that it divides N (default: {defaults['teams']})",
    )
    _method_flag(
        parser,
        sync,
        "sag",
        choices=choices["sag"],
        help=f"{SPARSE_DEFAULT}: Spar-All-Gather variant, bruck (a Bruck gather of adaptive "
        "top-h lists) or recursive (the authors' pairwise reduction; d a power "
        f"of two) (default: {defaults['sag']})",
    )
    _method_flag(
        parser,
        sync,
        "srs",
        choices=choices["srs"],
        help=f"{SPARSE_DEFAULT}: Spar-Reduce-Scatter execution, rounds (one message per round) "
        "or blocks (one block per step, as the authors' code; same numbers, "
        f"more messages) (default: {defaults['srs']})",
    )
    _method_flag(
        parser,
        sync,
        "dense_warmup",
        type=int,
        metavar="STEPS",
        help="synchronize densely for the first STEPS iterations "
        f"(default: {defaults['dense_warmup']})",
    )
    _method_flag(
        parser,
        sync,
        "wire",
        choices=WIRES,
        help="every method: the wire format of its messages, fp32 (int32 indices, float32 "
        "values), fp16 or bf16 (16-bit values, indices as 16-bit offsets where they fit: about "
        "half the bytes; what quantization removes stays in the residual) "
        f"(default: {defaults['wire']})",
    )
    sync.add_argument(
        "--method-option",
        action="append",
        metavar="KEY=VALUE",
        help="an option of the method (repeatable), its value converted to the type of the "
        "option's default: e.g. in_flight=2 for oktopk, teams=2 for spardl; the keys are "
        "the method's keyword options (compressors.options). It wins over the dedicated flag "
        "of the same option (--teams, --sag, --srs, --dense-warmup, --wire), with a note",
    )


def _overlap_and_sharding_flags(sync):
    sync.add_argument(
        "--bucket-mb",
        type=float,
        default=25.0,
        metavar="MB",
        help="overlap: the most MiB of gradient per bucket; each bucket is synchronized by its "
        "own synchronizer while backward computes the next (default: 25, as DDP)",
    )
    sync.add_argument(
        "--no-overlap",
        action="store_true",
        help="the authors' way: one blocking synchronization of the whole flat gradient after "
        "backward (default: buckets overlapped with backward)",
    )
    sharding = sync.add_mutually_exclusive_group()
    sharding.add_argument(
        "--fsdp",
        action="store_true",
        help="sharded data parallelism (FSDP2's fully_shard over every rank): natively, or with "
        "--compression --compressor NAME through the sparse reduce-scatter (docs/FSDP.md)",
    )
    sharding.add_argument(
        "--hsdp",
        action="store_true",
        help="hybrid sharding: shards within a host, replicas across hosts (hosts from "
        "SPARDL_CLUSTER, else the ranks sharing memory); natively, or with --compression "
        "--compressor NAME averaging the shards across hosts sparsely (docs/FSDP.md)",
    )
    sync.add_argument(
        "--residual-dtype",
        choices=RESIDUAL_DTYPES,
        default="fp32",
        help="--fsdp or --hsdp with a sparse method: how each FSDP module keeps its "
        "error-feedback residual, fp32, or bf16 (half the memory; the modules share float32 "
        "synchronizers, and the bf16 rounding of the residual is lost) (default: fp32)",
    )


#: DiLoCo's outer optimizer (Douillard et al.): Nesterov, learning rate 0.7, momentum 0.9.
OUTER_DEFAULTS = {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}


def _local_flags(local):
    local.add_argument(
        "--local-steps",
        type=int,
        default=1,
        metavar="H",
        help="take H optimizer steps on each worker's own gradient, then synchronize the "
        "pseudo-gradient (the start of the H steps minus their end) with the run's method and "
        "take an outer step (DiLoCo, docs/LOCAL_SGD.md); 1: synchronize every step's gradient "
        "(default: 1)",
    )
    local.add_argument(
        "--outer-optimizer",
        choices=("sgd", "nesterov"),
        help="with --local-steps H > 1: the outer step, nesterov (DiLoCo's) or sgd (heavy-ball "
        "momentum; local SGD is sgd with --outer-lr 1 --outer-momentum 0) (default: nesterov)",
    )
    local.add_argument(
        "--outer-lr",
        type=float,
        metavar="LR",
        help="with --local-steps H > 1: the outer learning rate, > 0 (default: 0.7)",
    )
    local.add_argument(
        "--outer-momentum",
        type=float,
        metavar="M",
        help="with --local-steps H > 1: the outer momentum, in [0, 1) (default: 0.9)",
    )
    local.add_argument(
        "--outer-overlap",
        action="store_true",
        help="with --local-steps H > 1: average each round's pseudo-gradient on a "
        "communication thread while the next round's steps compute, and apply it one round "
        "late (Streaming DiLoCo's overlap; needs MPI_THREAD_MULTIPLE, mpi4py's default) "
        "(default: off)",
    )


def _local_problems(args):
    """What ``--local-steps`` and the outer flags cannot be; fills in the outer defaults."""
    given = [
        f"--{key.replace('_', '-')}" for key in OUTER_DEFAULTS if getattr(args, key) is not None
    ] + (["--outer-overlap"] if args.outer_overlap else [])
    for key, value in OUTER_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.local_steps < 1:
        return [f"--local-steps must be at least 1, got {args.local_steps}"]
    if args.local_steps == 1:
        return [f"{', '.join(given)} only act with --local-steps H > 1"] if given else []
    problems = []
    if not (args.outer_lr > 0 and math.isfinite(args.outer_lr)):
        problems.append(f"--outer-lr must be a number > 0, got {args.outer_lr}")
    if not 0 <= args.outer_momentum < 1:
        problems.append(f"--outer-momentum must lie in [0, 1), got {args.outer_momentum}")
    if args.fsdp or args.hsdp:
        problems.append(
            f"--local-steps with --{'fsdp' if args.fsdp else 'hsdp'}: local steps need every "
            "rank to hold the whole model"
        )
    if is_ddp_method(args.compressor):
        problems.append(
            f"--local-steps with {args.compressor}: a DDP method averages every step inside "
            "backward; give a registered method (--method dense, spardl, ...)"
        )
    if args.method_options.get("momentum"):
        problems.append(
            "--local-steps with momentum correction (the method's momentum option): the outer "
            "step's momentum is --outer-momentum, and the inner SGD keeps --momentum"
        )
    return problems


def _output_flags(run):
    run.add_argument(
        "--log-dir", metavar="DIR", help="write metrics.jsonl and TensorBoard events here"
    )
    run.add_argument(
        "--checkpoint-dir", metavar="DIR", help="save a checkpoint here after every epoch"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in --checkpoint-dir, also one "
        "written by another number of ranks (its error feedback resharded; docs/ELASTIC.md)",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="ITERS",
        help="also save a checkpoint every ITERS iterations within an epoch (default 0: at "
        "epoch ends only); a resume goes on from that iteration",
    )
    run.add_argument(
        "--keep-global-batch",
        action="store_true",
        help="on a resume by another number of ranks, keep the checkpointed run's global "
        "batch (--batch-size becomes its global batch / ranks) instead of the per-rank batch",
    )
    run.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: CUDA when available (default: auto)",
    )


def parse_settings(argv, comm):
    """Parse and check the command line; return (args, training settings) or raise UsageError.

    Only cheap checks happen here, before anything heavy is built. Collective. Sets
    ``args.method_options``: the method options the run gives (its flags and --method-option,
    converted and checked by the registry; the method's defaults fill the rest).
    """
    parser = build_parser(comm.Get_rank())
    args = parser.parse_args(argv)
    size = comm.Get_size()
    problems, notes = [], []
    if args.dnn not in models.available():
        problems.append(
            f"unknown model {args.dnn!r}; choose one of: {', '.join(models.available())}"
        )
    try:
        settings = merge(load_config(args.config or config_path(args.dnn)), vars(args))
    except ConfigError as error:
        settings = merge(DEFAULTS, vars(args))
        if args.dnn in models.available():
            problems.append(str(error))
    agree(comm, settings_differ(comm, vars(args), settings))  # collective, and the first
    if settings["dataset"] not in datasets.available():
        problems.append(
            f"unknown data set {settings['dataset']!r}; choose one of: "
            f"{', '.join(datasets.available())}"
        )
    elif args.dnn in models.available():
        problems += _task_problems(args.dnn, settings["dataset"])
    if args.method is not None:
        if args.compressor is not None and args.compressor != args.method:
            problems.append(
                f"--method {args.method} and --compressor {args.compressor} name different "
                "methods; give one of them"
            )
        args.compressor, args.compression = args.method, True
    flag = "--method" if args.method is not None else "--compressor"
    ddp = is_ddp_method(args.compressor)
    ignored = args.compressor if not args.compression and not ddp else None
    args.compressor = args.compressor or (SPARSE_DEFAULT if args.compression else "dense")
    try:
        if not ddp:
            args.compressor = compressors.resolve(args.compressor).name  # topkA -> topk
    except ValueError as error:
        problems.append(
            f"{flag} {args.compressor}: {error}; or a DDP method: {', '.join(DDP_METHODS)}"
        )
        known = False
    else:
        known = True
        if ignored not in (None, "dense"):
            notes.append(
                f"--compressor {ignored} has no effect without --compression; synchronizing densely"
            )
            args.compressor = "dense"
    problems += _range_problems(args, settings, size)
    try:
        cluster_topology()
    except ValueError as error:
        problems.append(str(error))
    args.method_options = {}
    if ddp:
        args.method_options, found = parse_ddp_options(args.compressor, args.method_option)
        problems += found + _ddp_problems(args)
        notes += _ddp_notes(args, settings, parser.method_flags)
    elif known:
        args.method_options, found, said = _method_options(args, parser.method_flags, size)
        problems += found
        notes += said
    problems += _sharding_problems(args, size, comm) + _local_problems(args)
    # Collective: a config file or data directory may be missing on one host only.
    agree(comm, "; ".join(problems) or None)
    if args.data_dir and not datasets.reads_files(settings["dataset"]):
        notes.append(f"--data-dir has no effect with {settings['dataset']}: it reads no files")
    for line in notes:
        note(comm, line)
    if args.compressor == "dense" or ddp:
        args.density = 1.0  # what a dense run keeps, and what its metrics report
    return args, settings


#: Settings that may differ between ranks: where each host keeps its files, and its devices.
PER_HOST = ("data_dir", "cache_dir", "config", "log_dir", "device", "loader_workers")


def settings_differ(comm, flags: dict, settings: dict):
    """The first setting (a flag, or a config file's entry) that differs between ranks, as a
    message, or None. Collective: one allgather of each rank's settings. It runs before any
    other collective: ranks started with different settings (an MPMD launch) would otherwise
    meet in collectives that do not match."""
    mine = {key: repr(value) for key, value in {**settings, **flags}.items() if key not in PER_HOST}
    everyone = comm.allgather(mine)
    for key in sorted(set().union(*everyone)):
        values = [ranks.get(key, "(not set)") for ranks in everyone]
        other = next((rank for rank, value in enumerate(values) if value != values[0]), None)
        if other is not None:
            name = f"--{key.replace('_', '-')}" if key in flags else f"the config's {key}"
            return (
                f"the ranks were started with different settings: {name} is {values[0]} on "
                f"rank 0 but {values[other]} on rank {other}; start every rank with the same "
                "command line"
            )
    return None


def _sharding_problems(args, size, comm):
    """Flags ``--fsdp`` and ``--hsdp`` cannot combine with; sets ``args.ranks_per_host``."""
    args.ranks_per_host = None
    if not (args.fsdp or args.hsdp):
        return _residual_dtype_problems(args, None)
    flag = "--fsdp" if args.fsdp else "--hsdp"
    problems = _residual_dtype_problems(args, flag)
    if size < 2:
        problems.append(f"{flag} needs at least 2 workers, got {size}")
    if args.no_overlap:
        problems.append(
            f"{flag} with --no-overlap: FSDP reduces each module's gradient in backward"
        )
    if is_ddp_method(args.compressor):
        problems.append(f"{flag} with {args.compressor}: a DDP method; use --fsdp natively instead")
    if args.hsdp and not problems:
        try:
            per_host = ranks_per_host(comm, cluster_topology())
        except ValueError:
            per_host = 0  # reported above
        hosts = size // per_host if per_host and size % per_host == 0 else 0
        if hosts < 2:
            problems.append(
                f"--hsdp needs at least 2 hosts of equal size; the {size} workers hold "
                f"{per_host} rank(s) per host (from SPARDL_CLUSTER, else the ranks sharing "
                "memory): use --fsdp"
            )
        args.ranks_per_host = per_host
    return problems


def _residual_dtype_problems(args, flag):
    """``--residual-dtype`` other than fp32 needs a sharded run (``flag``: ``--fsdp`` or
    ``--hsdp``, else None) whose method keeps a residual: not FSDP's own (dense) reduction."""
    dtype = args.residual_dtype
    if dtype == "fp32" or is_ddp_method(args.compressor):  # a DDP method: refused with --fsdp
        return []
    if flag is None:
        return [
            f"--residual-dtype {dtype} without --fsdp or --hsdp: it sets how a sharded run's "
            "sparse method keeps its residuals"
        ]
    try:
        keeps = args.compressor != "dense" and compressors.resolve(args.compressor).uses_residual
    except ValueError:  # an unknown method: reported already
        return []
    if not keeps:
        return [
            f"--residual-dtype {dtype} with a native {flag} run: FSDP's own reduction keeps no "
            "residual; give a sparse method (--method NAME)"
            if args.compressor == "dense"
            else f"--residual-dtype {dtype} with {args.compressor}: it keeps no residual"
        ]
    return []


def _ddp_problems(args):
    """Flags a DDP method (``trainer.torch_ddp``) cannot honour."""
    problems = []
    if args.no_overlap:
        problems.append(
            f"--no-overlap has no meaning with {args.compressor}: DDP always overlaps its "
            "all-reduce with backward (the blocking all-reduce is --compressor dense --no-overlap)"
        )
    return problems


def _ddp_notes(args, settings, flags):
    """Notes for flags a DDP method ignores or reads differently."""
    notes = []
    unused = [flag for key, flag in flags.items() if getattr(args, key) is not None]
    if unused:
        notes.append(
            f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect "
            f"with {args.compressor}"
        )
    if args.density != 0.01:
        notes.append(f"--density has no effect with {args.compressor}")
    if settings["clip_grad_norm"]:
        notes.append(
            f"with {args.compressor}, --clip-grad-norm clips the averaged gradient after DDP "
            "synchronized it (as DDP users do), not each worker's before"
        )
    return notes


def _method_options(args, flags, size):
    """``(options, problems, notes)``: the options of method ``args.compressor`` that the
    command line gives, converted and checked by the registry (``compressors.try_options``:
    the method's own checks, and one build of it for a gradient of one entry).

    ``flags`` maps the options that have a flag of their own to it (``{"teams": "--teams"}``).
    A ``--method-option KEY=VALUE`` wins over the flag of the same option (a note says so when
    they differ). A flag the method does not take is noted unused, except that ``--teams`` must
    divide N for every method.
    """
    method = args.compressor
    valid = compressors.options(method)
    given = {key: getattr(args, key) for key in flags if getattr(args, key) is not None}
    problems, notes = [], []
    explicit = {}
    for text in args.method_option or []:
        try:
            key, value = compressors.split_option(text)
            explicit[key] = compressors.parse_option(method, key, value)
        except ValueError as error:
            problems.append(f"--method-option {text}: {error}")
    teams = args.teams
    if teams not in (None, "auto") and "teams" not in explicit and (teams < 1 or size % teams):
        problems.insert(0, f"--teams {teams} must divide the number of workers {size}")
    options = {key: value for key, value in given.items() if key in valid}
    for key, value in explicit.items():
        if key in given and given[key] != value:
            notes.append(f"--method-option {key}={value} wins over {flags[key]} {given[key]}")
    options.update(explicit)
    if not problems:
        try:
            options = compressors.try_options(method, size, **options)
        except ValueError as error:
            message = _in_flag_terms(
                str(error), {key: flags[key] for key in given if key not in explicit}
            )
            if any(re.search(rf"(?<![-\w]){key}\b", message) for key in explicit):
                message = f"--method-option: {message}"
            problems.append(message)
    unused = [flags[key] for key in given if key not in valid]
    if unused:
        notes.append(
            f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect with {method}"
        )
    return options, problems, notes


def _in_flag_terms(message, flags):
    """The registry's ``message`` with the options given by flags written as those flags:
    ``sag='recursive' needs teams ...`` becomes ``--sag recursive needs --teams ...``."""
    for key, flag in flags.items():
        message = re.sub(rf"(?<![-\w]){key}=('?)([^',;\s]*)\1", rf"{flag} \2", message)
        message = re.sub(rf"(?<![-\w]){key}\b(?!=)", flag, message)
    return message


def _task_problems(model, dataset):
    """A model trains only on data of its task (images, text classification, masked LM)."""
    if models.task(model) == datasets.task(dataset):
        return []
    fitting = [name for name in datasets.available() if datasets.task(name) == models.task(model)]
    return [f"model {model} trains on {' or '.join(fitting)} ({models.task(model)}), not {dataset}"]


def note(comm, message):
    if comm.Get_rank() == 0:
        print(f"main_trainer.py: note: {message}", file=sys.stderr, flush=True)


def _range_problems(args, settings, size):
    """The flags' values out of range, each named with its flag and value (and the config file,
    where the value came from there: ``--batch-size`` is also the config's ``batch_size``)."""
    checks = _flag_checks(args, size) + _setting_checks(args, settings)
    problems = [message for ok, message in checks if not ok] + _data_dir_problems(args, settings)
    for flag, directory in (
        ("--log-dir", args.log_dir),
        ("--checkpoint-dir", args.checkpoint_dir),
        ("--cache-dir", args.cache_dir),
    ):
        problem = directory is not None and _directory_problem(flag, directory)
        if problem:
            problems.append(problem)
    return problems


def _flag_checks(args, size):
    """``(ok, message)`` for the flags that have no config-file setting."""
    return [
        (0.0 < args.density <= 1.0, f"--density must lie in (0, 1], got {args.density}"),
        (
            args.nworkers in (None, size),
            f"--nworkers {args.nworkers} does not match the {size} MPI process(es) started",
        ),
        (not args.resume or args.checkpoint_dir, "--resume needs --checkpoint-dir"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA device"),
        (
            args.max_iters is None or args.max_iters >= 1,
            f"--max-iters must be at least 1, got {args.max_iters}",
        ),
        (args.eval_every >= 0, f"--eval-every must be at least 0, got {args.eval_every}"),
        (
            args.checkpoint_every >= 0,
            f"--checkpoint-every must be at least 0, got {args.checkpoint_every}",
        ),
        (
            not args.checkpoint_every or args.checkpoint_dir,
            "--checkpoint-every needs --checkpoint-dir",
        ),
        (
            args.dense_warmup is None or args.dense_warmup >= 0,
            f"--dense-warmup must be at least 0, got {args.dense_warmup}",
        ),
    ]


def _setting_checks(args, settings):
    """``(ok, message)`` for the flags that are also config-file settings (and a few after)."""
    config_file = args.config or config_path(args.dnn)

    def got(key):
        given = getattr(args, key, None) is not None
        return f"got {settings[key]}" + ("" if given else f" (from {config_file}'s {key})")

    return [
        (
            settings["batch_size"] >= 1,
            f"--batch-size must be at least 1, {got('batch_size')}",
        ),
        (
            settings["eval_batch_size"] >= 1,
            f"--eval-batch-size must be at least 1, {got('eval_batch_size')}",
        ),
        (
            settings["max_epochs"] >= 0,
            f"--max-epochs must be at least 0, {got('max_epochs')}",
        ),
        (
            math.isfinite(settings["lr"]) and settings["lr"] > 0,
            f"--lr must be a positive number, {got('lr')}",
        ),
        (
            math.isfinite(settings["warmup_epochs"]) and settings["warmup_epochs"] >= 0,
            f"--warmup-epochs must be a number >= 0, {got('warmup_epochs')}",
        ),
        (
            math.isfinite(settings["lr_gamma"]) and settings["lr_gamma"] > 0,
            f"--lr-gamma must be a positive number, {got('lr_gamma')}",
        ),
        (
            0 <= settings["momentum"] < math.inf,
            f"--momentum must be a number >= 0, {got('momentum')}",
        ),
        (
            0 <= settings["weight_decay"] < math.inf,
            f"--weight-decay must be a number >= 0, {got('weight_decay')}",
        ),
        (
            settings["loader_workers"] >= 0,
            f"--loader-workers must be at least 0, {got('loader_workers')}",
        ),
        (
            0 <= settings["clip_grad_norm"] < math.inf,
            f"--clip-grad-norm must be a number >= 0, {got('clip_grad_norm')}",
        ),
        (0 <= args.seed < 2**32, f"--seed must lie in [0, 2^32), got {args.seed}"),
        (
            0 < args.bucket_mb < math.inf,
            f"--bucket-mb must be a number of MiB above 0, got {args.bucket_mb:g}",
        ),
        (
            all(m >= 0 for m in settings["lr_milestones"]),
            f"--lr-milestones must be epochs >= 0, {got('lr_milestones')}",
        ),
    ]


def _data_dir_problems(args, settings):
    """--data-dir: a name (not ''), and, for a data set that reads files, a directory that
    exists (or that --download may create). Whether it holds anything is checked with the data
    (:func:`load_data`), where the message can say what belongs there."""
    if args.data_dir == "":
        return [f"--data-dir is empty; name a directory (default: ./{DEFAULT_DATA_DIR})"]
    dataset = settings["dataset"]
    if (
        args.data_dir is None
        or dataset not in datasets.available()
        or not datasets.reads_files(dataset)
        or args.download
        or Path(args.data_dir).exists()
    ):
        return []
    return [f"data directory {args.data_dir} does not exist (--data-dir)"]


def _directory_problem(flag, directory):
    """A message if ``directory`` is not, and cannot be made, a writable directory; else None.

    Nothing is created here (the log and checkpoint writers make their directories), so a
    rejected run leaves no directory behind.
    """
    path = Path(directory).absolute()
    try:
        existing = next(part for part in (path, *path.parents) if part.exists())
    except OSError as error:
        return f"{flag} {directory}: {error.strerror or error}"
    if not existing.is_dir():
        return f"{flag} {directory}: {existing} is not a directory"
    try:  # a file made and removed: os.access says yes to root, also on /sys and /proc
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        return f"{flag} {directory}: not writable ({error.strerror or error})"
    return None
