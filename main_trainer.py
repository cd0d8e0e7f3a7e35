"""Data-parallel training with sparse gradient synchronization: the command line.

    mpiexec -n N python main_trainer.py [--dnn NAME] [--dataset NAME] [--compression
        --compressor NAME --density D] ...

With no flags it trains a small CNN on scikit-learn's 8x8 digits (offline, about a minute on
2 CPU cores). Every flag is described by ``--help`` and in docs/TRAINING.md. This file only
parses, validates, builds and runs; the training loop lives in ``trainer``.
Bad input ends every rank with exit status 2 and one message from rank 0; a failure during
training prints the failing rank's traceback and aborts the whole job. A diverged run (a loss or
gradient not finite) ends every rank at the same step with status 1 and one line from rank 0;
Ctrl-C likewise, with status 130 and a line naming the step and the last complete checkpoint.
"""

# ruff: noqa: E402 - Ctrl-C's handler and MPI's launch defaults come before the imports below
import argparse
import math
import os
import random
import re
import signal
import sys
import tempfile
import warnings
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C during the seconds of imports below: status 130, no traceback
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from allreducers.transports.environment import apply_launch_defaults, cluster_topology

if __name__ == "__main__":
    # Threads per rank and MPICH's yielding while waiting, where the user set nothing: before
    # MPI starts, which the mpi4py import below does.
    apply_launch_defaults()

import numpy as np
import torch
from mpi4py import MPI

import compressors
import datasets
import models
from allreducers.transports.mpi import end_interrupted
from allreducers.transports.placement import place_rank
from allreducers.wire import WIRES
from trainer.checkpoint import Checkpoints, UnsafeCheckpoint
from trainer.config import DEFAULTS, ConfigError, config_path, load_config, merge
from trainer.data import make_loaders, smallest_training_batch
from trainer.distributed import UsageError, abort_on_error, agree, broadcast_tensors
from trainer.loop import Trainer
from trainer.metrics import MetricsLog
from trainer.overlap import OverlappedSync
from trainer.schedule import make_scheduler
from trainer.sharded import FSDPSync, ranks_per_host
from trainer.stopping import INTERRUPTED, Stopped
from trainer.torch_ddp import METHODS as DDP_METHODS
from trainer.torch_ddp import DDPSync, is_ddp_method
from trainer.torch_ddp import parse_options as parse_ddp_options

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on: main()'s handling

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


def _plural(count, word, plural=None):
    """``1 iteration``, ``2 iterations``."""
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


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
    model = parser.add_argument_group("model and data")
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

    training = parser.add_argument_group("training (defaults: the model's config file)")
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

    sync = parser.add_argument_group("gradient synchronization")
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

    run = parser.add_argument_group("output and devices")
    run.add_argument(
        "--log-dir", metavar="DIR", help="write metrics.jsonl and TensorBoard events here"
    )
    run.add_argument(
        "--checkpoint-dir", metavar="DIR", help="save a checkpoint here after every epoch"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in --checkpoint-dir",
    )
    run.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: CUDA when available (default: auto)",
    )
    return parser


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
    ddp = is_ddp_method(args.compressor)
    ignored = args.compressor if not args.compression and not ddp else None
    args.compressor = args.compressor or (SPARSE_DEFAULT if args.compression else "dense")
    try:
        if not ddp:
            args.compressor = compressors.resolve(args.compressor).name  # topkA -> topk
    except ValueError as error:
        problems.append(f"{error}; or a DDP method: {', '.join(DDP_METHODS)}")
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
    problems += _sharding_problems(args, size, comm)
    # Collective: a config file or data directory may be missing on one host only.
    agree(comm, "; ".join(problems) or None)
    if args.data_dir and not datasets.reads_files(settings["dataset"]):
        notes.append(f"--data-dir has no effect with {settings['dataset']}: it reads no files")
    for note in notes:
        _note(comm, note)
    if args.compressor == "dense" or ddp:
        args.density = 1.0  # what a dense run keeps, and what its metrics report
    return args, settings


def _sharding_problems(args, size, comm):
    """Flags ``--fsdp`` and ``--hsdp`` cannot combine with; sets ``args.ranks_per_host``."""
    args.ranks_per_host = None
    if not (args.fsdp or args.hsdp):
        return []
    flag = "--fsdp" if args.fsdp else "--hsdp"
    problems = []
    if size < 2:
        problems.append(f"{flag} needs at least 2 workers, got {size}")
    if args.no_overlap:
        problems.append(
            f"{flag} with --no-overlap: FSDP reduces each module's gradient in backward"
        )
    if is_ddp_method(args.compressor):
        problems.append(f"{flag} with {args.compressor}: a DDP method; use --fsdp natively instead")
    if args.resume:
        problems.append(f"{flag} with --resume: sharded checkpoints are not supported yet")
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


def _ddp_problems(args):
    """Flags a DDP method (``trainer.torch_ddp``) cannot honour."""
    problems = []
    if args.no_overlap:
        problems.append(
            f"--no-overlap has no meaning with {args.compressor}: DDP always overlaps its "
            "all-reduce with backward (the blocking all-reduce is --compressor dense --no-overlap)"
        )
    if args.resume and args.compressor == "powersgd":
        problems.append(
            "--resume with powersgd: PowerSGD's error feedback and warm-start matrices are not "
            "checkpointed; start a fresh run (ddp, ddp_fp16 and ddp_bf16 resume)"
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


def loader_workers(settings, comm):
    """The loader processes per rank: the setting, at most the CPUs this process may use (a
    note says so). Asked for once everything else is checked, so the note comes with no error."""
    cpus = len(os.sched_getaffinity(0))
    if settings["loader_workers"] > cpus:
        _note(
            comm,
            f"{settings['loader_workers']} loader workers (--loader-workers or the config) are "
            f"more than the {cpus} CPU(s) this process may use; using {cpus}",
        )
    return min(settings["loader_workers"], cpus)


def _note(comm, message):
    if comm.Get_rank() == 0:
        print(f"main_trainer.py: note: {message}", file=sys.stderr, flush=True)


def _range_problems(args, settings, size):
    """The flags' values out of range, each named with its flag and value (and the config file,
    where the value came from there: ``--batch-size`` is also the config's ``batch_size``)."""
    config_file = args.config or config_path(args.dnn)

    def got(key):
        given = getattr(args, key, None) is not None
        return f"got {settings[key]}" + ("" if given else f" (from {config_file}'s {key})")

    checks = [
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
            args.dense_warmup is None or args.dense_warmup >= 0,
            f"--dense-warmup must be at least 0, got {args.dense_warmup}",
        ),
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


def load_data(args, settings, comm):
    """Load the data set on every rank; with --download, rank 0 first fetches it where it is
    missing (on rank 0's host) and every rank loads again (collective). A --data-dir named
    explicitly that is an empty directory is refused (without --download), saying what the
    data set expects there. Caches go to --cache-dir, never into the data directory."""
    data_dir = args.data_dir or DEFAULT_DATA_DIR
    name, options = settings["dataset"], settings["data_options"]
    cache_dir = getattr(args, "cache_dir", None) or datasets.default_cache_dir()
    split, problem = _load_split(name, data_dir, cache_dir, options)
    if args.download and any(comm.allgather(problem is not None)):
        failure = None
        if comm.Get_rank() == 0 and problem is not None:
            try:
                datasets.download(name, data_dir)
            except datasets.DataError as error:
                failure = " ".join(str(error).split())  # torchvision's mirror list: one line
        agree(comm, failure)
        if problem is not None:
            split, problem = _load_split(name, data_dir, cache_dir, options)
    elif args.data_dir and datasets.reads_files(name) and _is_empty_directory(args.data_dir):
        problem = f"--data-dir {args.data_dir} is an empty directory" + (
            f": {problem}"
            if problem
            else f"; {name} was found elsewhere: leave --data-dir out to use that copy"
        )
    agree(comm, problem)
    return split


def _is_empty_directory(path):
    try:
        return Path(path).is_dir() and not any(Path(path).iterdir())
    except OSError:  # unreadable: the loader says so
        return False


def _load_split(name, data_dir, cache_dir, options):
    """(the ``DataSplit``, None), or (None, why it cannot be loaded)."""
    try:
        return datasets.load(name, data_dir, cache_dir=cache_dir, **options), None
    except datasets.DataError as error:
        return None, str(error)


def build_model(args, split, batch_size, comm, device):
    """Create the model, check it trains on batches of the data's images, and copy rank 0's
    weights.

    The check is one training-mode forward pass of the smallest batch training will use, at
    most two images (``trainer.data``: a last batch of one is dropped, but a shard of one sample
    is one batch of one), so batch norm over 1x1 maps is caught too; the buffers it updates
    (batch-norm statistics) are put back.
    """
    with warnings.catch_warnings():  # images too small for the model: refused below, in one line
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        model = models.create(
            args.dnn,
            split.num_classes,
            split.input_shape,
            vocab_size=getattr(split, "vocab_size", None),
        )
    problem = None
    buffers = [buffer.clone() for buffer in model.buffers()]
    images = min(2, smallest_training_batch(len(split.train), comm.Get_size(), batch_size))
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # dropout draws nothing for real
            # Text data sets (datasets.text.TextSplit) take token indices, not float images.
            dtype = getattr(split, "input_dtype", torch.float32)
            model(torch.zeros(images, *split.input_shape, dtype=dtype))
    except (RuntimeError, ValueError) as error:  # a size mismatch; batch norm over one value
        problem = (
            f"model {args.dnn} cannot train on batches of "
            f"{'x'.join(map(str, split.input_shape))} images of this data set: {error}"
        )
        if images == 1 < batch_size:  # a shard of one sample
            problem += (
                f" (the {len(split.train)} training samples give each of the {comm.Get_size()} "
                "workers a shard of one sample: use fewer workers or more data)"
            )
    for buffer, saved in zip(model.buffers(), buffers):
        buffer.copy_(saved)
    agree(comm, problem)
    broadcast_tensors(model.state_dict().values(), comm)
    return model.to(device)


def build_synchronizer(args, numel, comm):
    """Create the synchronizer with the options ``parse_settings`` took (collective); a value
    only the method's constructor checks (``in_flight=0``) is a usage error here."""
    synchronizer, problem = None, None
    try:
        synchronizer = compressors.create(
            args.compressor, comm, numel=numel, density=args.density, **args.method_options
        )
        synchronizer.count_nnz = (
            False  # the trainer logs no non-zero count: no pass for it in the timed call
        )
    except ValueError as error:
        problem = str(error)
    agree(comm, problem)
    return synchronizer


def effective_density(synchronizer, comm):
    """The fraction of entries ``synchronizer`` keeps per call, recorded in every metrics row;
    a note (rank 0) where rounding to whole entries moves it more than 10% from --density (a
    density below 1/n, or below 1/B for SparDL's blocks of B entries, keeps one entry)."""
    effective, asked = synchronizer.effective_density, synchronizer.density
    if abs(effective - asked) > 0.1 * asked:
        kept = round(effective * synchronizer.numel)
        _note(
            comm,
            f"--density {asked:g} keeps {kept:,} of the {synchronizer.numel:,} gradient "
            f"entries per call with {synchronizer.name}: an effective density of "
            f"{effective:.3g} (metrics rows record it as effective_density)",
        )
    return effective


def _checkpoint_problem(checkpoints, args, size):
    """Why the checkpoints already in ``--checkpoint-dir`` forbid this run, or None
    (collective): a fresh run would mix with an earlier one, and a resume needs one complete for
    ``size`` ranks."""
    found = checkpoints.saved_epochs()
    epochs = ", ".join(map(str, found))
    if found and not args.resume:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of an earlier run (epochs "
            f"{epochs}): pass --resume to continue it, or choose an empty directory"
        )
    if found and checkpoints.newest_complete() is None:
        return (
            f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints (epochs {epochs}), none "
            f"of them complete for this run's {size} worker(s): written by another number of "
            "workers?"
        )
    return None


def read_checkpoint(checkpoints, args, run_info, comm):
    """``(epoch, state)`` of the newest complete checkpoint for ``--resume``, or ``(None, None)``
    without one (collective). Read before anything heavy is built, and refused (``UsageError``)
    if unreadable or saved by a run of another model, data set, worker count, compressor,
    density, or method option (each option of the method the checkpoint records: every one
    since they are all recorded, only teams, sag and srs before)."""
    epoch = checkpoints.newest_complete()
    if epoch is None:
        _note(comm, f"no checkpoint in {args.checkpoint_dir}; starting from scratch")
        return None, None
    try:
        state, problem = checkpoints.load(epoch), None
    except UnsafeCheckpoint as error:
        state, problem = None, str(error)
    except Exception as error:  # noqa: BLE001 - whatever makes the file unreadable: one clear message
        state, problem = (
            None,
            (
                f"checkpoint {checkpoints.path(epoch)} is unreadable ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else 'no detail'}); remove "
                f"{checkpoints.path(epoch).parent} to resume from the epoch before it"
            ),
        )
    agree(comm, problem)
    saved = dict(state.get("run_info", {}), nworkers=state.get("nworkers"))
    keys = ["model", "dataset", "nworkers", "compressor", "density"] + [
        key for key in _option_defaults(args.compressor) if key in saved
    ]  # older checkpoints: state_mismatch, later
    differ = [
        f"{key} {saved.get(key)} (this run: {run_info.get(key)})"
        for key in keys
        if saved.get(key) != run_info.get(key)
    ]
    agree(comm, _misfit(epoch, args, differ))
    return epoch, state


def resume(trainer, epoch, state, args, comm, log):
    """Load ``state``, :func:`read_checkpoint`'s checkpoint of ``epoch``, into ``trainer``
    (collective) once the checks that need the built model and synchronizer pass: the same
    number of parameters, and a synchronizer state that fits (``state_mismatch``)."""
    saved, numel = state.get("synchronizer", {}).get("numel"), trainer.synchronizer.numel
    overlapped = bool(state.get("synchronizer", {}).get("overlap"))
    problem = (
        f"parameters {saved} (this run: {numel})"
        if saved != numel
        else "a synchronizer state of an overlapped run (resume it without --no-overlap)"
        if overlapped and not trainer.overlapped
        else trainer.synchronizer.state_mismatch(state.get("synchronizer"))
    )
    agree(comm, _misfit(epoch, args, [problem] if problem else []))
    trainer.load_state_dict(state)
    log.note(f"resumed from the checkpoint of epoch {epoch}")


def _option_defaults(method):
    """The options of ``method`` (registered or DDP) with their defaults."""
    if is_ddp_method(method):
        return dict(DDP_METHODS[method])
    return compressors.option_defaults(method)


def _misfit(epoch, args, differ):
    """The message refusing the checkpoint of ``epoch`` for the reasons ``differ``, or None."""
    return (
        (
            f"checkpoint of epoch {epoch} in {args.checkpoint_dir} does not fit this run: "
            f"{'; '.join(differ)}"
        )
        if differ
        else None
    )


def _optimizer_momentum(args, settings, comm):
    """SGD's momentum: ``--momentum``, or 0 with momentum correction (the method's ``momentum``
    option), which applies momentum per entry inside the synchronizer instead."""
    corrected = args.method_options.get("momentum", 0.0)
    if not corrected:
        return settings["momentum"]
    if settings["momentum"]:
        _note(
            comm,
            f"momentum correction (momentum={corrected:g}) applies momentum inside the "
            f"synchronizer, before sparsification: SGD runs without it (--momentum "
            f"{settings['momentum']:g} unused)",
        )
    return 0.0


def build_trainer(argv, comm):
    """Parse, validate and build everything; return a ready ``Trainer`` or raise UsageError."""
    args, settings = parse_settings(argv, comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    run_info = {
        "model": args.dnn,
        "dataset": settings["dataset"],
        "task": datasets.task(settings["dataset"]),
        "compressor": args.compressor,
        "density": args.density,
        "nworkers": size,
        "batch_size": settings["batch_size"],
        "network": os.environ.get("SPARDL_NETWORK_RATE", "loopback"),  # scripts/shaped_network.sh
        "topology": cluster_topology(),  # scripts/cluster_network.sh's hosts, ranks per host, rates
        # Every option of the method, as given or its default (``teams``, ``sag``, ... in rows)
        **_option_defaults(args.compressor),
        **args.method_options,
    }
    checkpoints = Checkpoints(args.checkpoint_dir, comm) if args.checkpoint_dir else None
    epoch, state = None, None
    if checkpoints:
        agree(comm, _checkpoint_problem(checkpoints, args, size))
        if args.resume:
            epoch, state = read_checkpoint(checkpoints, args, run_info, comm)
    device = place_rank(comm, args.device)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    split = load_data(args, settings, comm)
    model = build_model(args, split, settings["batch_size"], comm, device)
    if is_ddp_method(args.compressor):
        synchronizer = DDPSync(
            comm,
            model,
            args.compressor,
            args.method_options,
            args.bucket_mb,
            device,
            note=lambda message: _note(comm, message),
        )
        run_info.update(effective_density=1.0, overlap=True, bucket_mb=synchronizer.bucket_mb)
    elif args.fsdp or args.hsdp:
        build_synchronizer(args, 1, comm)  # checks the options the constructor checks
        sparse = args.compressor != "dense"
        synchronizer = FSDPSync(
            comm,
            model,
            args.compressor if sparse else None,
            args.density,
            args.method_options if sparse else {},
            device,
            args.ranks_per_host if args.hsdp else None,
        )
        run_info.update(
            effective_density=synchronizer.density,
            sharding="hsdp" if args.hsdp else "fsdp",
            ranks_per_host=args.ranks_per_host,
            overlap=True,
            bucket_mb=None,
        )
    else:
        synchronizer = build_synchronizer(
            args, sum(p.numel() for p in model.parameters() if p.requires_grad), comm
        )
        run_info["effective_density"] = effective_density(synchronizer, comm)
    sharded = args.fsdp or args.hsdp
    overlap = not args.no_overlap and not is_ddp_method(args.compressor) and not sharded
    if overlap and settings["clip_grad_norm"]:
        _note(
            comm,
            "--clip-grad-norm clips each worker's whole gradient before it is synchronized, "
            "which cannot overlap backward: synchronizing after backward (as --no-overlap)",
        )
        overlap = False
    if not is_ddp_method(args.compressor) and not sharded:
        run_info["overlap"], run_info["bucket_mb"] = overlap, args.bucket_mb if overlap else None
    if overlap:  # the flat synchronizer above checked the options and gave the density
        synchronizer = OverlappedSync(
            comm, model, args.compressor, args.density, args.method_options, args.bucket_mb
        )
    train_loader, test_loader = make_loaders(
        split,
        settings["batch_size"],
        settings["eval_batch_size"],
        rank,
        size,
        args.seed,
        loader_workers(settings, comm),
        device,
    )
    iters_per_epoch = min(len(train_loader), args.max_iters or len(train_loader))
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=settings["lr"],
        momentum=_optimizer_momentum(args, settings, comm),
        weight_decay=settings["weight_decay"],
    )
    scheduler = make_scheduler(
        optimizer,
        iters_per_epoch,
        settings["warmup_epochs"],
        size,
        settings["lr_milestones"],
        settings["lr_gamma"],
    )
    log = MetricsLog(args.log_dir, rank)
    trainer = Trainer(
        model=model,
        train_loader=train_loader,
        test_loader=test_loader,
        synchronizer=synchronizer,
        optimizer=optimizer,
        scheduler=scheduler,
        comm=comm,
        device=device,
        log=log,
        max_epochs=settings["max_epochs"],
        iters_per_epoch=iters_per_epoch,
        run_info=run_info,
        checkpoints=checkpoints,
        clip_grad_norm=settings["clip_grad_norm"],
        eval_every=args.eval_every,
    )
    if state is not None:
        resume(trainer, epoch, state, args, comm, log)
    log.start(trainer.epoch)
    log.note(
        f"{args.dnn} on {settings['dataset']}: {_plural(synchronizer.numel, 'parameter')}, "
        f"{_plural(size, 'worker')} on {device}, {args.compressor} (density {args.density}), "
        f"batch {settings['batch_size']} per worker, "
        f"{_plural(iters_per_epoch, 'iteration')} per epoch"
    )
    early = [m for m in settings["lr_milestones"] if m < settings["warmup_epochs"]]
    if early:
        log.note(
            f"--lr-milestones {','.join(map(str, early))} fall inside the "
            f"{settings['warmup_epochs']:g}-epoch warm-up: their decay starts when it ends"
        )
    if trainer.epoch >= settings["max_epochs"]:
        log.note(
            f"nothing to train: {trainer.epoch} of --max-epochs {settings['max_epochs']} "
            "epochs done"
        )
    return trainer


def main(argv=None):
    """Run the trainer; return the process exit status (0; 2 for bad input; 1 for a diverged
    run; 130 when interrupted)."""
    comm = MPI.COMM_WORLD
    trainer = None
    try:
        with abort_on_error(comm):
            try:
                trainer = build_trainer(argv, comm)
            except UsageError as error:
                _say(comm, f"error: {error}")
                return 2
            try:
                trainer.fit()
            except Stopped as stop:  # on every rank, at the same step
                _say(comm, str(stop))
                return stop.status
    except KeyboardInterrupt:  # outside training, or a second Ctrl-C: no step to agree on
        _exit_interrupted(comm, trainer)
    return 0


def _say(comm, line):
    if comm.Get_rank() == 0:
        print(f"main_trainer.py: {line}", file=sys.stderr, flush=True)


def _exit_interrupted(comm, trainer):
    """End every rank at once with status 130 after rank 0's one line (other ranks may be
    waiting inside an MPI call, where they cannot see the signal: ``end_interrupted``)."""
    end_interrupted(
        comm,
        "main_trainer.py: "
        + (
            trainer.interrupted_line()
            if trainer
            else "interrupted before training started; no checkpoint was written"
        ),
    )


def _exit_at_once(status):
    """End the process with ``status`` now, skipping the interpreter's teardown (seconds with
    torch loaded, on a busy machine): what a user who pressed Ctrl-C waits for. Every rank
    stopped at the same step and finalizes MPI with the others."""
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.Finalize()
    os._exit(status)


if __name__ == "__main__":
    status = main()
    if status == INTERRUPTED:
        _exit_at_once(status)
    sys.exit(status)
