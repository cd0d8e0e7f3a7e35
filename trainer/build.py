"""Building a run from its command line: the data, the model, the synchronizer, the trainer.

:func:`build_trainer` parses and checks the flags (``trainer.cli``), reads a checkpoint to
resume from (``trainer.resume``), and builds everything collectively: every rank gets the same
model (rank 0's weights) and a synchronizer of the protocol the loop speaks (``trainer.flat``):
blocking, overlapped buckets, a PyTorch DDP method, FSDP, or local steps (DiLoCo).
"""

from __future__ import annotations

import math
import os
import random
import warnings
from pathlib import Path

import numpy as np
import torch

import compressors
import datasets
import models
from allreducers.transports.environment import cluster_topology
from allreducers.transports.placement import host_ranks, place_rank
from compressors.diloco import DiLoCo
from trainer.checkpoint import Checkpoints
from trainer.cli import DEFAULT_DATA_DIR, note, parse_settings
from trainer.data import make_loaders, smallest_training_batch
from trainer.distributed import UsageError, agree, broadcast_tensors
from trainer.flat import FlatSync
from trainer.local import LocalSync
from trainer.loop import Trainer
from trainer.metrics import MetricsLog
from trainer.overlap import OverlappedSync
from trainer.resume import checkpoint_problem, option_defaults, read_checkpoint, resume
from trainer.schedule import make_scheduler
from trainer.sharded import FSDPSync
from trainer.torch_ddp import DDPSync, is_ddp_method


def _plural(count, word, plural=None):
    """``1 iteration``, ``2 iterations``."""
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def loader_workers(settings, comm):
    """The loader processes per rank: the setting, at most the CPUs this process may use (a
    note says so). Asked for once everything else is checked, so the note comes with no error."""
    cpus = len(os.sched_getaffinity(0))
    if settings["loader_workers"] > cpus:
        note(
            comm,
            f"{settings['loader_workers']} loader workers (--loader-workers or the config) are "
            f"more than the {cpus} CPU(s) this process may use; using {cpus}",
        )
    return min(settings["loader_workers"], cpus)


def _check_batch_fits(batch_size, num_samples, size):
    """Refuse a per-rank batch larger than a rank's shard of the training set: every batch
    would be the shard, smaller than the header and the learning rate assume. The same on every
    rank (the shards have equal sizes), so no collective."""
    shard = math.ceil(num_samples / size)
    if batch_size > shard:
        raise UsageError(
            f"batch size {batch_size} per rank is more than the {shard} training examples each "
            f"of the {size} rank(s) holds ({num_samples} in all); give --batch-size {shard} or "
            "less"
        )


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
        note(
            comm,
            f"--density {asked:g} keeps {kept:,} of the {synchronizer.numel:,} gradient "
            f"entries per call with {synchronizer.name}: an effective density of "
            f"{effective:.3g} (metrics rows record it as effective_density)",
        )
    return effective


def _optimizer_momentum(args, settings, comm):
    """SGD's momentum: ``--momentum``, or 0 with momentum correction (the method's ``momentum``
    option), which applies momentum per entry inside the synchronizer instead."""
    corrected = args.method_options.get("momentum", 0.0)
    if not corrected:
        return settings["momentum"]
    if settings["momentum"]:
        note(
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
    run_info = _run_info(args, settings, size)
    checkpoints = Checkpoints(args.checkpoint_dir, comm) if args.checkpoint_dir else None
    epoch, state = None, None
    if checkpoints:
        agree(comm, checkpoint_problem(checkpoints, args, size))
        if args.resume:
            epoch, state = read_checkpoint(checkpoints, args, run_info, comm)
            if state is not None:
                _resumed_batch(args, settings, state, run_info, comm)
    device = place_rank(comm, args.device)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    split = load_data(args, settings, comm)
    _check_batch_fits(settings["batch_size"], len(split.train), size)
    model = build_model(args, split, settings["batch_size"], comm, device)
    synchronizer = build_synchronization(args, settings, model, device, run_info, comm)
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
        checkpoint_every=args.checkpoint_every,
    )
    if state is not None:
        resume(trainer, epoch, state, args, comm, log)
    log.start(trainer.epoch)
    _announce(args, settings, trainer, size, device)
    return trainer


def _resumed_batch(args, settings, state, run_info, comm):
    """With ``--keep-global-batch``, a resume by another number of ranks takes the checkpointed
    run's global batch: the per-rank batch becomes it divided by this run's ranks (which must
    divide it). Without it the per-rank batch stays ``--batch-size`` and the global batch
    changes with the world size (docs/ELASTIC.md)."""
    size, saved = comm.Get_size(), state.get("nworkers") or comm.Get_size()
    if not args.keep_global_batch or saved == size:
        return
    batch = state.get("batch_size") or state.get("run_info", {}).get("batch_size")
    total = batch * saved if isinstance(batch, int) else None
    agree(
        comm,
        None
        if total and total % size == 0
        else f"--keep-global-batch: the checkpoint's global batch "
        f"{total if total else 'is not recorded'} is not divisible by this run's {size} ranks",
    )
    settings["batch_size"] = run_info["batch_size"] = total // size
    note(comm, f"--keep-global-batch: a global batch of {total}, {total // size} per rank")


def _run_info(args, settings, size):
    """What every metrics row records of the run (``effective_density``, ``overlap`` and
    ``bucket_mb`` follow once the synchronizer is built)."""
    return {
        "model": args.dnn,
        "dataset": settings["dataset"],
        "task": datasets.task(settings["dataset"]),
        "compressor": args.compressor,
        "density": args.density,
        "nworkers": size,
        "batch_size": settings["batch_size"],
        "seed": args.seed,
        "network": os.environ.get("SPARDL_NETWORK_RATE", "loopback"),  # scripts/shaped_network.sh
        "topology": cluster_topology(),  # scripts/cluster_network.sh's hosts, ranks per host, rates
        # Every option of the method, as given or its default (``teams``, ``sag``, ... in rows)
        **option_defaults(args.compressor),
        **args.method_options,
    }


def build_synchronization(args, settings, model, device, run_info, comm):
    """The run's synchronization (``trainer.flat``'s protocol), recording in ``run_info`` its
    effective density, whether it overlaps backward and its bucket size (collective)."""
    if is_ddp_method(args.compressor):
        synchronizer = DDPSync(
            comm,
            model,
            args.compressor,
            args.method_options,
            args.bucket_mb,
            device,
            note=lambda message: note(comm, message),
        )
        run_info.update(effective_density=1.0, overlap=True, bucket_mb=synchronizer.bucket_mb)
        return synchronizer
    if args.fsdp or args.hsdp:
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
            residual_dtype=args.residual_dtype,
        )
        run_info.update(
            effective_density=synchronizer.density,
            sharding="hsdp" if args.hsdp else "fsdp",
            ranks_per_host=args.ranks_per_host,
            overlap=True,
            bucket_mb=None,
            **({"residual_dtype": synchronizer.residual_dtype} if sparse else {}),
        )
        return synchronizer
    # --outer-overlap: the outer synchronization runs on the communication thread while the
    # loop's own collectives go on, so it gets a communicator of its own.
    own = comm.Dup() if args.local_steps > 1 and args.outer_overlap else comm
    flat = build_synchronizer(
        args, sum(p.numel() for p in model.parameters() if p.requires_grad), own
    )
    run_info["effective_density"] = effective_density(flat, comm)
    if args.local_steps > 1:
        return _local_sync(args, flat, model, device, run_info, comm)
    overlap = not args.no_overlap
    if overlap and settings["clip_grad_norm"]:
        note(
            comm,
            "--clip-grad-norm clips each worker's whole gradient before it is synchronized, "
            "which cannot overlap backward: synchronizing after backward (as --no-overlap)",
        )
        overlap = False
    run_info["overlap"], run_info["bucket_mb"] = overlap, args.bucket_mb if overlap else None
    if overlap:  # the flat synchronizer above checked the options and gave the density
        return OverlappedSync(
            comm, model, args.compressor, args.density, args.method_options, args.bucket_mb
        )
    return FlatSync(flat, model, device)


def _local_sync(args, synchronizer, model, device, run_info, comm):
    """``--local-steps`` H > 1: DiLoCo with ``synchronizer`` as its outer synchronization
    (every rank starts from rank 0's weights, which the trainer broadcast: ``same_start``)."""
    outer = DiLoCo(
        model,
        comm=synchronizer.transport,
        local_steps=args.local_steps,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        nesterov=args.outer_optimizer == "nesterov",
        synchronizer=synchronizer,
        overlap=args.outer_overlap,
        same_start=True,
    )
    run_info.update(
        overlap=False,
        outer_overlap=args.outer_overlap,
        bucket_mb=None,
        local_steps=args.local_steps,
        outer_optimizer=args.outer_optimizer,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
    )
    return LocalSync(outer, model, device)


def _announce(args, settings, trainer, size, device):
    """The run's first lines: what trains where, and the flags that do less than they say."""
    log = trainer.log
    log.note(
        f"{args.dnn} on {settings['dataset']}: {_plural(trainer.synchronizer.numel, 'parameter')}, "
        f"{_plural(size, 'worker')} on {device}, {args.compressor} (density {args.density}), "
        f"batch {settings['batch_size']} per worker, "
        f"{_plural(trainer.iters_per_epoch, 'iteration')} per epoch"
    )
    if args.local_steps > 1:
        log.note(
            f"local steps: {args.local_steps} optimizer steps per worker, then the "
            f"pseudo-gradient synchronized by {args.compressor} and an outer "
            f"{args.outer_optimizer} step (lr {args.outer_lr:g}, momentum {args.outer_momentum:g})"
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
    if device.type == "cuda" and isinstance(trainer.synchronizer, OverlappedSync):
        shared = shared_gpu_note(host_ranks(trainer.comm)[1], torch.cuda.device_count())
        if shared:
            log.note(shared)


def shared_gpu_note(local_ranks: int, gpus: int) -> str | None:
    """The note for overlapped buckets when ``local_ranks`` ranks share a host's ``gpus``."""
    if local_ranks <= gpus:
        return None
    return (
        f"{local_ranks} ranks share this host's {_plural(gpus, 'GPU')}: there the overlapped "
        "buckets measured slower than one blocking call (docs/PERFORMANCE.md, 'On a GPU'); "
        "--no-overlap may be faster, and NVIDIA's MPS (nvidia-cuda-mps-control -d, started "
        "before the job) lets the ranks' kernels run side by side"
    )
