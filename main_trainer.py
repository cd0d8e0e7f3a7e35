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

import argparse
import math
import os
import random
import signal
import sys
import tempfile
import warnings
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C during the seconds of imports below: status 130, no traceback
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from allreducers.transports.environment import apply_launch_defaults  # noqa: E402

if __name__ == "__main__":
    # Threads per rank and MPICH's yielding while waiting, where the user set nothing: before
    # MPI starts, which the mpi4py import below does.
    apply_launch_defaults()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import compressors  # noqa: E402
import datasets  # noqa: E402
import models  # noqa: E402
from allreducers.transports.mpi import end_interrupted  # noqa: E402
from allreducers.transports.placement import place_rank  # noqa: E402
from trainer.checkpoint import Checkpoints, UnsafeCheckpoint  # noqa: E402
from trainer.config import DEFAULTS, ConfigError, config_path, load_config, merge  # noqa: E402
from trainer.data import make_loaders, smallest_training_batch  # noqa: E402
from trainer.distributed import UsageError, abort_on_error, agree, broadcast_tensors  # noqa: E402
from trainer.loop import Trainer  # noqa: E402
from trainer.metrics import MetricsLog  # noqa: E402
from trainer.schedule import make_scheduler  # noqa: E402
from trainer.stopping import INTERRUPTED, Stopped  # noqa: E402

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on: main()'s handling

DEFAULT_MODEL = "cnn"
DEFAULT_DATA_DIR = "data"
#: The options of a method that its saved state depends on: part of a run's ``run_info``.
STRUCTURE = ("teams", "sag", "srs")


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises ``UsageError`` and prints (help) on rank 0 only."""

    def __init__(self, rank, **kwargs):
        super().__init__(**kwargs)
        self.rank = rank

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
        "fashion-mnist is also found in /usr/share/datasets/fashion-mnist)",
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
        help="at most this many iterations per epoch (quick runs; default: all)",
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
        help=f"method: {', '.join(compressors.available())} (default with --compression: spardl)",
    )
    sync.add_argument(
        "--density",
        type=float,
        default=0.01,
        metavar="D",
        help="fraction of gradient entries kept, in (0, 1] (default: 0.01)",
    )
    sync.add_argument(
        "--teams",
        type=int,
        default=1,
        metavar="d",
        help="spardl: teams d for Spar-All-Gather, a divisor of N (default: 1)",
    )
    sync.add_argument(
        "--sag",
        choices=["bruck", "recursive"],
        default="bruck",
        help="spardl: Spar-All-Gather variant, bruck (a Bruck gather of adaptive "
        "top-h lists) or recursive (the authors' pairwise reduction; d a power "
        "of two) (default: bruck)",
    )
    sync.add_argument(
        "--srs",
        choices=["rounds", "blocks"],
        default="rounds",
        help="spardl: Spar-Reduce-Scatter execution, rounds (one message per round) "
        "or blocks (one block per step, as the authors' code; same numbers, "
        "more messages) (default: rounds)",
    )
    sync.add_argument(
        "--dense-warmup",
        type=int,
        default=0,
        metavar="STEPS",
        help="synchronize densely for the first STEPS iterations (default: 0)",
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

    Only cheap checks happen here, before anything heavy is built. Collective.
    """
    args = build_parser(comm.Get_rank()).parse_args(argv)
    problems = []
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
    ignored = args.compressor if not args.compression else None
    args.compressor = args.compressor or ("spardl" if args.compression else "dense")
    try:
        args.compressor = compressors.resolve(args.compressor).name  # topkA -> topk
    except ValueError as error:
        problems.append(str(error))
    problems += _range_problems(args, settings, comm.Get_size())
    # Collective: a config file or data directory may be missing on one host only.
    agree(comm, "; ".join(problems) or None)
    if ignored not in (None, "dense"):
        _note(
            comm,
            f"--compressor {ignored} has no effect without --compression; synchronizing densely",
        )
        args.compressor = "dense"
    if args.compressor == "dense":
        args.density = 1.0  # what a dense run keeps, and what its metrics report
    return args, settings


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
    checks = [
        (0.0 < args.density <= 1.0, f"--density must lie in (0, 1], got {args.density}"),
        (
            args.nworkers in (None, size),
            f"--nworkers {args.nworkers} does not match the {size} MPI process(es) started",
        ),
        (
            args.data_dir != "",
            f"--data-dir is empty; name a directory (default: ./{DEFAULT_DATA_DIR})",
        ),
        (
            not args.data_dir or args.download or Path(args.data_dir).exists(),
            f"data directory {args.data_dir} does not exist",
        ),
        (not args.resume or args.checkpoint_dir, "--resume needs --checkpoint-dir"),
        (args.device != "cuda" or torch.cuda.is_available(), "--device cuda: no CUDA device"),
        (args.max_iters is None or args.max_iters >= 1, "--max-iters must be at least 1"),
        (args.dense_warmup >= 0, "--dense-warmup must be at least 0"),
        (
            settings["batch_size"] >= 1 and settings["eval_batch_size"] >= 1,
            "batch sizes must be at least 1",
        ),
        (settings["max_epochs"] >= 0, "--max-epochs must be at least 0"),
        (math.isfinite(settings["lr"]) and settings["lr"] > 0, "--lr must be a positive number"),
        (
            math.isfinite(settings["warmup_epochs"]) and settings["warmup_epochs"] >= 0,
            "--warmup-epochs must be a number >= 0",
        ),
        (
            math.isfinite(settings["lr_gamma"]) and settings["lr_gamma"] > 0,
            "--lr-gamma must be a positive number",
        ),
        (0 <= settings["momentum"] < math.inf, "--momentum must be a number >= 0"),
        (0 <= settings["weight_decay"] < math.inf, "--weight-decay must be a number >= 0"),
        (settings["loader_workers"] >= 0, "--loader-workers must be at least 0"),
        (0 <= settings["clip_grad_norm"] < math.inf, "--clip-grad-norm must be a number >= 0"),
        (0 <= args.seed < 2**32, f"--seed must lie in [0, 2^32), got {args.seed}"),
        (all(m >= 0 for m in settings["lr_milestones"]), "--lr-milestones must be epochs >= 0"),
    ]
    problems = [message for ok, message in checks if not ok] + _team_problems(args, size)
    for flag, directory in (("--log-dir", args.log_dir), ("--checkpoint-dir", args.checkpoint_dir)):
        problem = directory is not None and _directory_problem(flag, directory)
        if problem:
            problems.append(problem)
    return problems


def _team_problems(args, size):
    """--teams must divide N (for every method: the contract's usage error); --sag recursive
    needs it a power of two, for a method that takes --sag (others note it unused)."""
    if args.teams < 1 or size % args.teams:
        return [f"--teams {args.teams} must divide the number of workers {size}"]
    method = args.compressor if args.compression else "dense"
    takes_sag = method in compressors.available() and "sag" in compressors.options(method)
    if takes_sag and args.sag == "recursive" and args.teams & (args.teams - 1):
        return [f"--sag recursive needs --teams a power of two, got {args.teams}; use --sag bruck"]
    return []


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
    missing (on rank 0's host) and every rank loads again (collective)."""
    data_dir = args.data_dir or DEFAULT_DATA_DIR
    split, problem = _load_split(settings["dataset"], data_dir, settings["data_options"])
    if args.download and any(comm.allgather(problem is not None)):
        failure = None
        if comm.Get_rank() == 0 and problem is not None:
            try:
                datasets.download(settings["dataset"], data_dir)
            except datasets.DataError as error:
                failure = " ".join(str(error).split())  # torchvision's mirror list: one line
        agree(comm, failure)
        if problem is not None:
            split, problem = _load_split(settings["dataset"], data_dir, settings["data_options"])
    agree(comm, problem)
    return split


def _load_split(name, data_dir, options):
    """(the ``DataSplit``, None), or (None, why it cannot be loaded)."""
    try:
        return datasets.load(name, data_dir, **options), None
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
    """Create the synchronizer with the options its method accepts (collective)."""
    given = {
        "teams": args.teams,
        "sag": args.sag,
        "srs": args.srs,
        "dense_warmup": args.dense_warmup,
    }
    options = {
        key: value for key, value in given.items() if key in compressors.options(args.compressor)
    }
    parser = build_parser()
    unused = [
        f"--{key.replace('_', '-')}"
        for key, value in given.items()
        if key not in options and value != parser.get_default(key)
    ]
    if unused:
        _note(comm, f"{', '.join(unused)} has no effect with {args.compressor}")
    synchronizer, problem = None, None
    try:
        synchronizer = compressors.create(
            args.compressor, comm, numel=numel, density=args.density, **options
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
    """Why the checkpoints already in ``--checkpoint-dir`` forbid this run, or None (collective):
    a fresh run would mix with an earlier one, and a resume needs one complete for ``size`` ranks."""
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
            f"of them complete for this run's {size} worker(s): written by another number of workers?"
        )
    return None


def read_checkpoint(checkpoints, args, run_info, comm):
    """``(epoch, state)`` of the newest complete checkpoint for ``--resume``, or ``(None, None)``
    without one (collective). Read before anything heavy is built, and refused (``UsageError``)
    if unreadable or saved by a run of another model, data set, worker count, compressor,
    density, or (checkpoints that record them) team count or SAG variant."""
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
        key for key in STRUCTURE if key in saved
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
    problem = (
        f"parameters {saved} (this run: {numel})"
        if saved != numel
        else trainer.synchronizer.state_mismatch(state.get("synchronizer"))
    )
    agree(comm, _misfit(epoch, args, [problem] if problem else []))
    trainer.load_state_dict(state)
    log.note(f"resumed from the checkpoint of epoch {epoch}")


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
        **{
            key: getattr(args, key)
            for key in STRUCTURE
            if key in compressors.options(args.compressor)
        },
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
    synchronizer = build_synchronizer(
        args, sum(p.numel() for p in model.parameters() if p.requires_grad), comm
    )
    run_info["effective_density"] = effective_density(synchronizer, comm)
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
        momentum=settings["momentum"],
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
    )
    if state is not None:
        resume(trainer, epoch, state, args, comm, log)
    log.start(trainer.epoch)
    log.note(
        f"{args.dnn} on {settings['dataset']}: {synchronizer.numel:,} parameters, "
        f"{size} worker(s) on {device}, {args.compressor} (density {args.density}), "
        f"batch {settings['batch_size']} per worker, {iters_per_epoch} iterations per epoch"
    )
    early = [m for m in settings["lr_milestones"] if m < settings["warmup_epochs"]]
    if early:
        log.note(
            f"--lr-milestones {','.join(map(str, early))} fall inside the "
            f"{settings['warmup_epochs']:g}-epoch warm-up: their decay starts when it ends"
        )
    if trainer.epoch >= settings["max_epochs"]:
        log.note(
            f"nothing to train: {trainer.epoch} of --max-epochs {settings['max_epochs']} epochs done"
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
