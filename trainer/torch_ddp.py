"""The trainer's PyTorch-DDP methods: what users would pick instead of a sparse method.

``ddp`` is DistributedDataParallel's own overlapped all-reduce (no hook), ``ddp_fp16`` and
``ddp_bf16`` DDP with torch's ``fp16_compress_hook`` / ``bf16_compress_hook``, ``powersgd`` DDP
with torch's ``powerSGD_hook`` (options ``rank``: the matrix approximation rank, and
``start_iter``: the iteration PowerSGD starts at, dense all-reduce before it).

:func:`start_group` starts ``torch.distributed`` (Gloo on CPU, NCCL on CUDA) from the MPI ranks
the trainer runs as; :class:`DDPSync` wraps the model in DDP and stands where the trainer's
overlapped synchronizer stands (the protocol of :mod:`trainer.flat`).

How it measures (docs/TRAINING.md): compute ends when the last parameter's gradient is
accumulated (a post-accumulate-grad hook on every parameter) or the last bucket's hook is called,
whichever is later; the exposed synchronization is from then to backward's return. With a hook,
a bucket's synchronization time is from its hook call to its future's completion, summed over the
buckets; ``ddp`` (no hook) runs its all-reduces inside DDP's C++ reducer, where Python sees no
bucket, so its synchronization time is its exposed part. Bytes are those of the all-reduces
counted as Rabenseifner's (2 (P-1)/P of each buffer per rank), as the other methods count a
library all-reduce.
"""

from __future__ import annotations

import atexit
import fcntl
import inspect
import math
import os
import socket
import struct
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from compressors import convert_option, split_option
from compressors.stats import call_record
from trainer import powersgd_state
from trainer.checkpoint import mode_mismatch
from trainer.flat import WholeState

#: The DDP methods and their options with defaults (``--method-option KEY=VALUE``).
#: ``start_iter`` 2: the first iteration torch allows with error feedback (DDP rebuilds its
#: buckets after the first), as the sparse methods compress from the start (``dense_warmup`` 0).
METHODS = {
    "ddp": {},
    "ddp_fp16": {},
    "ddp_bf16": {},
    "powersgd": {"rank": 4, "start_iter": 2},
}
#: The smallest value of each option.
MINIMUM = {"rank": 1, "start_iter": 2}
DESCRIPTIONS = {
    "ddp": "DistributedDataParallel's own overlapped all-reduce (no hook)",
    "ddp_fp16": "DDP with torch's fp16_compress_hook (float16 all-reduce)",
    "ddp_bf16": "DDP with torch's bf16_compress_hook (bfloat16 all-reduce)",
    "powersgd": "DDP with torch's powerSGD_hook (options rank, start_iter)",
}


def is_ddp_method(name) -> bool:
    """Whether ``name`` is one of the DDP methods (:data:`METHODS`)."""
    return name in METHODS


def parse_options(method, texts):
    """``(options, problems)``: the ``--method-option KEY=VALUE`` texts of DDP ``method``.

    The texts are split and converted as every method's are (``compressors.split_option``,
    ``compressors.convert_option``): keys take ``-`` for ``_``, values are whole numbers, here
    of at least :data:`MINIMUM`. Options not given take their defaults. ``problems`` holds one
    message per bad text.
    """
    defaults = METHODS[method]
    options, problems = dict(defaults), []
    for text in texts or []:
        try:
            key, value = split_option(text)
            number = convert_option(method, key, value, defaults)
        except ValueError as error:
            problems.append(f"--method-option {text}: {error}")
            continue
        if number < MINIMUM[key]:
            problems.append(f"--method-option {text}: {key} must be at least {MINIMUM[key]}")
        else:
            options[key] = number
    return options, problems


def _ipv4_addresses() -> dict:
    """This process's IPv4 address per network interface (``{"eth0": "169.254.77.1", ...}``)."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:  # no IPv4 address on it
                continue
            found[name] = socket.inet_ntoa(answer[20:24])
    return found


def _own_interface(addresses: dict, prefer=None):
    """``(interface, address)``: ``prefer`` where it has an address, else the first that is not
    a loopback; ``(None, None)`` with none."""
    if prefer in addresses:
        return prefer, addresses[prefer]
    for name, address in addresses.items():
        if not address.startswith("127."):
            return name, address
    return None, None


def _closest_interface(addresses: dict, target: str):
    """The interface whose address shares the most leading bits with ``target``."""

    def common(address):
        a, b = (struct.unpack("!I", socket.inet_aton(x))[0] for x in (address, target))
        return 32 - (a ^ b).bit_length()

    candidates = {n: a for n, a in addresses.items() if not a.startswith("127.")}
    return max(candidates, key=lambda name: common(candidates[name]), default=None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start_group(comm, device) -> str:
    """Start ``torch.distributed`` on the ranks of MPI communicator ``comm`` (collective).

    Gloo on CPU, NCCL on CUDA; rank and size are MPI's. ``MASTER_ADDR`` and ``MASTER_PORT``
    come from the environment where both are set. Otherwise rank 0 picks a free port and an
    address: 127.0.0.1 where every rank shares its network namespace (one machine,
    scripts/shaped_network.sh), else the address of its interface ``GLOO_SOCKET_IFNAME`` or
    ``FI_TCP_IFACE`` names or its first one that is not a loopback (scripts/cluster_network.sh:
    its host's 169.254.77.x). Across namespaces, a rank without ``GLOO_SOCKET_IFNAME`` gets the
    interface closest to rank 0's address, so Gloo talks over the host's link.

    Returns:
        The ``host:port`` the group was started at (already started: ``""``).
    """
    if dist.is_initialized():
        return ""
    rank, size = comm.Get_rank(), comm.Get_size()
    spaces = comm.allgather(os.stat("/proc/self/ns/net").st_ino)
    shared = len(set(spaces)) == 1
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (address and port):
        chosen = None
        if rank == 0:
            prefer = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("FI_TCP_IFACE")
            own = _own_interface(_ipv4_addresses(), prefer)[1]
            chosen = (address or ("127.0.0.1" if shared else own or "127.0.0.1"), port)
            chosen = (chosen[0], chosen[1] or str(_free_port()))
        address, port = comm.bcast(chosen, root=0)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "gloo" and not shared and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = os.environ.get("FI_TCP_IFACE") or _closest_interface(_ipv4_addresses(), address)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    options = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=size, **options
    )
    atexit.register(_end_group, comm)
    return f"{address}:{port}"


def _end_group(comm) -> None:
    """At exit: every rank ends the group together (an MPI barrier, then
    ``destroy_process_group``), so that no rank's Gloo threads are torn down by the interpreter
    while a peer still talks to them, which aborted a run now and then ("terminate called
    without an active exception"). Not reached on Ctrl-C's immediate exit."""
    if dist.is_initialized():
        comm.Barrier()
        dist.destroy_process_group()


def allreduce_bytes(numel: int, element_size: int, size: int) -> float:
    """Bytes one rank sends in an all-reduce of ``numel`` entries: 2 (P-1)/P of the buffer."""
    return 2 * (size - 1) / size * numel * element_size if size > 1 else 0.0


def powersgd_entries(shapes, rank: int, min_compression_rate: float = 2) -> int:
    """Entries PowerSGD all-reduces for a bucket of parameters of ``shapes`` once it runs.

    As ``powerSGD_hook``: vectors, and matrices (``shape[0]`` by the rest) not worth
    compressing, whole; the others as P (n x r) and Q (m x r), r = min(n, m, rank).
    """
    total = 0
    for shape in shapes:
        if len(shape) <= 1:
            total += math.prod(shape)
            continue
        n, m = shape[0], math.prod(shape[1:])
        r = min(n, m, rank)
        if (n + m) * rank * min_compression_rate < n * m:  # powerSGD's _should_compress
            total += (n + m) * r
        else:
            total += n * m
    return total


class _Timing:
    """One step's measurements, written by the autograd and communication threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.last_event = 0.0  # perf_counter of the last gradient ready or hook call
        self.sync_seconds = 0.0
        self.bytes_sent = 0.0
        self.buckets = 0

    def event(self, when: float) -> None:
        with self.lock:
            self.last_event = max(self.last_event, when)


def _timed(measure, hook, bytes_of):
    """A comm hook that runs ``hook`` and records its call time, duration and bytes."""

    def timed_hook(state, bucket):
        started = time.perf_counter()
        measure.event(started)
        sent = bytes_of(state, bucket)
        future = hook(state, bucket)

        def done(finished):
            value = finished.value()  # raises the hook's error into DDP's backward
            with measure.lock:
                measure.sync_seconds += time.perf_counter() - started
                measure.bytes_sent += sent
                measure.buckets += 1
            return value

        return future.then(done)

    return timed_hook


class DDPSync(WholeState):
    """The model in DistributedDataParallel with DDP method ``method``; the trainer's
    synchronizer (overlapped: the loop calls :meth:`finish` after backward).

    Args:
        comm: the ``mpi4py`` communicator (its ranks become the ``torch.distributed`` group).
        model: the module, already on ``device``, with rank 0's weights on every rank.
        method: a name of :data:`METHODS`.
        options: the method's options (:func:`parse_options`).
        bucket_mb: DDP's ``bucket_cap_mb`` (every bucket, the first too).
        device: the rank's device.
        note: called with a one-line note for the user (rank 0 prints it).

    Attributes:
        ddp_model: the DDP wrapper; the loop's training forward goes through it.
        bucket_mb: the bucket size used (PowerSGD on Gloo: the whole model, one bucket).
        numel, name, density, stats: as the trainer's other synchronizers.
    """

    def __init__(self, comm, model, method, options, bucket_mb, device, note=print) -> None:
        self.address = start_group(comm, device)
        self.name, self.options, self.density = method, dict(options), 1.0
        self.size = comm.Get_size()
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in trainable)
        self.bucket_mb = bucket_mb
        whole_mb = sum(p.numel() * p.element_size() for p in trainable) / 2**20
        if method == "powersgd" and dist.get_backend() == "gloo" and whole_mb > bucket_mb:
            self.bucket_mb = math.ceil(whole_mb) + 1.0
            note(
                f"powersgd on Gloo: one bucket of {self.bucket_mb:g} MiB for the whole model "
                f"instead of --bucket-mb {bucket_mb:g} (with several, PowerSGD's chained "
                "all-reduces reach Gloo in different orders on different ranks, which aborts)"
            )
        # The trainer copies rank 0's buffers after each epoch, not at every forward.
        buffers = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}
        )
        self.ddp_model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_mb,
            **buffers,
        )
        self._measure = _Timing()
        self.powersgd_state = None
        self._layouts = powersgd_state.Layouts(trainable)
        hook, state, bytes_of = self._hook(method)
        if hook is not None:
            self.ddp_model.register_comm_hook(state, _timed(self._measure, hook, bytes_of))
        self._handles = [
            p.register_post_accumulate_grad_hook(lambda _: self._measure.event(time.perf_counter()))
            for p in trainable
        ]
        self._parameters = trainable
        self.stats = self._stats()

    def _hook(self, method):
        """``(hook, state, bytes_of)`` of ``method``; ``(None, None, None)`` for ``ddp``."""
        size = self.size
        if method == "ddp":
            return None, None, None
        if method in ("ddp_fp16", "ddp_bf16"):
            hook = (
                default_hooks.fp16_compress_hook
                if method == "ddp_fp16"
                else default_hooks.bf16_compress_hook
            )
            return hook, None, lambda _, bucket: allreduce_bytes(bucket.buffer().numel(), 2, size)
        state = self.powersgd_state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=self.options["rank"],
            start_powerSGD_iter=self.options["start_iter"],
        )

        def bytes_of(state, bucket):
            if state.iter < state.start_powerSGD_iter:
                entries = bucket.buffer().numel()
            else:
                shapes = [tuple(p.shape) for p in bucket.parameters()]
                entries = powersgd_entries(
                    shapes, state.matrix_approximation_rank, state.min_compression_rate
                )
            return allreduce_bytes(entries, bucket.buffer().element_size(), size)

        return self._layouts.wrap(powersgd.powerSGD_hook), state, bytes_of

    def _stats(self, compute_end=None) -> dict:
        measure = self._measure
        sync, sent = measure.sync_seconds, measure.bytes_sent
        if self.name == "ddp":  # no hook: what Python sees is the wait after compute
            sent = allreduce_bytes(self.numel, 4, self.size)
            sync = time.perf_counter() - compute_end if compute_end else 0.0
        return {  # the one record (compressors.stats): DDP's own reductions, timed as a whole
            **call_record({"bytes_sent": sent}, None, {"comm": sync, "total": sync}),
            "sync_seconds": sync,
            "compute_end": compute_end,
            "buckets": measure.buckets,
        }

    overlaps_backward = True

    @property
    def forward_model(self):
        """The DDP wrapper: the training forward goes through it."""
        return self.ddp_model

    def finish(self, agree) -> None:
        """After backward (DDP has averaged every bucket into ``.grad``): take the step's stats,
        then ``agree`` with whether every average is finite (the same on every rank)."""
        measure = self._measure
        with measure.lock:
            self.stats = self._stats(measure.last_event or None)
            measure.reset()
        grads = [p.grad for p in self._parameters if p.grad is not None]
        agree(finite=not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()))

    def state_dict(self) -> dict:
        """The method and size, and PowerSGD's hook state (its error feedback, warm-start
        matrices, count and generator: :mod:`trainer.powersgd_state`); DDP's all-reduce and the
        16-bit hooks keep none."""
        state = {"overlap": True, "ddp": True, "method": self.name, "numel": self.numel}
        if self.powersgd_state is not None:
            state["powersgd"] = powersgd_state.state_dict(self.powersgd_state, self._layouts)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (PowerSGD's state where it holds one).

        Raises:
            ValueError: a PowerSGD state of another matrix approximation rank.
        """
        if self.powersgd_state is not None and "powersgd" in state:
            powersgd_state.load_state_dict(self.powersgd_state, state["powersgd"], self._layouts)

    def state_mismatch(self, state) -> str | None:
        """Why ``state`` cannot be loaded here, or ``None``."""
        return mode_mismatch(state, "ddp", True, "a run without a DDP method", self.name)
