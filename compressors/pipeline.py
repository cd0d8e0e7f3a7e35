"""Synchronize gradient buckets in the background while backward goes on.

    pipeline = BucketPipeline(transport, "spardl", density=0.01)
    future = pipeline.submit(keys, sizes, flat_bucket, space=bucket_index)  # returns at once
    ...                                       # backward continues, later buckets are submitted
    pipeline.wait()                           # every bucket averaged (future.value() each)

Each process has one communication thread per group (:func:`comm_thread`). It runs the
submitted buckets one at a time, in the order they were submitted, which must be the same on
every rank (DDP fires its buckets in index order on every rank; a trainer submits in the order
of its bucket list). So at most one thread at a time calls the transport, and while buckets are
in flight the caller's thread must not call it: MPI needs ``MPI_THREAD_SERIALIZED``
(checked when the pipeline starts), and a ``torch.distributed`` group is only used by that one
thread meanwhile. Each bucket's synchronizer talks through a :class:`TaggedTransport` of its
own (tag space ``space``), so its messages and its traffic counters are its own.

Per bucket the result has the bits of the blocking ``sync.allreduce`` of that bucket: the
thread runs exactly that call. Residuals stay per parameter in a
:class:`~compressors.residuals.ResidualStore`.

On CUDA a bucket's work (selection, residuals, staging through the host or the device-side
collectives) runs on a side stream (:func:`side_stream`), not on the stream that backward
fills: :meth:`BucketPipeline.submit` records an event on the caller's current stream, the side
stream waits for it (so it reads the finished gradients) and nothing more, and the
communication thread waits for the side stream's work before it completes the future. So a
future's value is final when the future is done; the future is also CUDA-aware (its
``wait()`` orders the waiting stream after the side stream), and :meth:`BucketPipeline.wait`
orders the caller's current stream after the side streams. CPU tensors take the same code as
before, without streams.
"""

from __future__ import annotations

import collections
import threading
import time

import torch

import compressors
from allreducers.transports import TaggedTransport, Transport
from allreducers.transports.tagged import TAG_STRIDE, tag_upper_bound

from .residuals import Layout, ResidualStore
from .stats import call_record, summed

__all__ = [
    "IDLE_SECONDS",
    "CommThread",
    "comm_thread",
    "post",
    "side_stream",
    "require_thread_support",
    "BucketPipeline",
]

#: Seconds an idle communication thread waits for work before it ends (a new one starts when
#: work comes again).
IDLE_SECONDS = 30.0


class CommThread:
    """A thread that runs submitted jobs one at a time, first in first out.

    Args:
        name: the thread's name.
        on_exit: called (under no lock) when the thread ends after being idle.
    """

    def __init__(self, name: str, on_exit=None) -> None:
        self._jobs: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._on_exit = on_exit
        self._stopped = self._closing = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def put(self, job) -> bool:
        """Queue ``job`` (a callable of no arguments); False if this thread has ended."""
        with self._ready:
            if self._stopped or self._closing:
                return False
            self._jobs.append(job)
            self._ready.notify()
            return True

    def stop(self, timeout: float = 60.0) -> None:
        """End the thread once the jobs already queued have run, and join it.

        Waits at most ``timeout`` seconds. Later ``put`` calls return False. A program that ends
        its process groups stops the thread first, so that no thread is left inside torch when
        the interpreter exits.
        """
        with self._ready:
            self._closing = True
            self._ready.notify()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                if not self._jobs and not self._closing:
                    self._ready.wait(IDLE_SECONDS)
                if not self._jobs:
                    self._stopped = True
                    break
                job = self._jobs.popleft()
            job()  # a job catches its own errors (see BucketPipeline._job)
        if self._on_exit is not None:
            self._on_exit(self)


_threads: dict = {}
_threads_lock = threading.Lock()


def _group_key(transport: Transport):
    """Return what identifies ``transport``'s rank of its group within this process."""
    return transport.process_key()


def comm_thread(transport: Transport) -> CommThread:
    """Return the communication thread of ``transport``'s rank, starting it if needed.

    One per process for MPI and ``torch.distributed`` (whichever communicator: one thread keeps
    their calls in one order), one per rank for an in-process group.
    """
    key = _group_key(transport)

    def forget(thread):
        with _threads_lock:
            if _threads.get(key) is thread:
                del _threads[key]

    with _threads_lock:
        thread = _threads.get(key)
        if thread is None or not thread.thread.is_alive() or thread._stopped or thread._closing:
            thread = _threads[key] = CommThread(f"spardl-comm-{key[-1]}", forget)
        return thread


def post(transport: Transport, job) -> None:
    """Queue ``job`` on the communication thread of ``transport``'s rank.

    A new thread takes it where the last one ended just now.
    """
    if not comm_thread(transport).put(job):
        comm_thread(transport).put(job)  # the old thread ended just now


_streams: dict = {}


def side_stream(transport: Transport, device: torch.device) -> torch.cuda.Stream:
    """Return the CUDA stream on which buckets of ``transport``'s rank are worked on ``device``.

    One per process and device (its one communication thread runs every pipeline's buckets in
    turn), and one per in-process group and device: that group's ranks hand device tensors to
    each other by reference, so they must work on one stream to see each other's writes. Its
    priority is high: its kernels are small, and the communication waits for each of them.
    """
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    key = _group_key(transport)
    key = (*(key[:2] if key[0] == "local" else key), device)
    with _threads_lock:
        stream = _streams.get(key)
        if stream is None:
            stream = _streams[key] = torch.cuda.Stream(device, priority=-1)
        return stream


def require_thread_support(transport: Transport) -> None:
    """Check that ``transport`` may be called from the communication thread.

    Raises:
        RuntimeError: an MPI transport whose library was started below
            ``MPI_THREAD_SERIALIZED`` (one clear message).
    """
    transport.check_threads("the overlapped bucket pipeline")


class BucketPipeline:
    """Averages buckets of parameters' gradients on the communication thread, in order.

    Args:
        transport: this rank's transport (anything ``compressors.create`` accepts as ``comm``).
        method: any name of ``compressors.available()``.
        density: the fraction of each bucket kept, in (0, 1].
        options: keyword options of the method (``compressors.options``).
        skip_nonfinite: a bucket with NaN or inf on any rank comes back as NaN on every rank
            (one extra one-element all-reduce per bucket) and leaves the residuals alone,
            instead of raising ``ValueError``.
        count_nnz: passed on to each synchronizer (False: no pass to count non-zeros).

    Attributes:
        residuals: the :class:`~compressors.residuals.ResidualStore` of the buckets' layouts
            (callers use :meth:`synchronizers`, :meth:`residual`, :meth:`state_dict` and
            :meth:`load_state_dict`).
        transport: the transport every bucket's view wraps.
        rank: this rank's number in the group.
        size: the number of ranks in the group.

    Raises:
        ValueError: an unknown method, density or option.
        RuntimeError: MPI without the thread support the pipeline needs.
    """

    def __init__(
        self,
        transport,
        method: str,
        density: float,
        options: dict | None = None,
        skip_nonfinite: bool = False,
        count_nnz: bool = False,
    ) -> None:
        from allreducers.transports import as_transport

        self.transport = as_transport(transport)
        self.rank, self.size = self.transport.rank, self.transport.size
        self.method = compressors.resolve(method).name
        self.density = density
        self.options = dict(options or {})
        self.skip_nonfinite = bool(skip_nonfinite)
        self.count_nnz = count_nnz
        self.residuals = ResidualStore()
        bound = tag_upper_bound(self.transport)
        self._spaces = max(1, (bound + 1) // TAG_STRIDE) if bound is not None else 1 << 20
        self._lock = threading.Condition()
        self._in_flight = 0
        self._error: BaseException | None = None
        self._stats: list = []
        self._sides: set = set()  # the side streams the submitted CUDA buckets ran on
        require_thread_support(self.transport)

    # -- the caller's thread ----------------------------------------------------------------

    def submit(self, keys, sizes, flat: torch.Tensor, space: int = 0) -> torch.futures.Future:
        """Start averaging one bucket; return a future of the average, completed later.

        The caller leaves ``flat`` untouched until the future is done. The average lands in the
        layout's result buffer (reused by the layout's next call; the future's value is it, or
        a copy cast to ``flat``'s dtype when that is not float32).

        Args:
            keys: the bucket's parameters' keys, in order (see :class:`ResidualStore`).
            sizes: their numbers of entries, summing to ``flat.numel()``.
            flat: the bucket's gradient, 1-D, of a floating dtype.
            space: the bucket's tag space (its index; the same on every rank).

        Returns:
            A ``torch.futures.Future`` that holds the average, or the error that ended the call
            (``ValueError`` for NaN or inf without ``skip_nonfinite``).
        """
        cuda = None
        if flat.is_cuda:  # the side stream must see what the caller's stream wrote into flat
            producer = torch.cuda.current_stream(flat.device)
            ready = torch.cuda.Event()
            ready.record(producer)
            cuda = (side_stream(self.transport, flat.device), ready, producer)
            future = torch.futures.Future(devices=[flat.device])
        else:
            future = torch.futures.Future()
        with self._lock:
            self._in_flight += 1
            if cuda is not None:
                self._sides.add(cuda[0])
        job = self._job(list(keys), list(sizes), flat, space % self._spaces, future, cuda)
        post(self.transport, job)
        return future

    def synchronize(self, keys, sizes, flat: torch.Tensor, space: int = 0) -> torch.Tensor:
        """Return the average of one bucket, blocking: :meth:`submit`, then its result.

        Raises:
            ValueError: as the future of :meth:`submit` would hold.
        """
        future = self.submit(keys, sizes, flat, space)
        self.wait()
        return future.value()

    def close(self, timeout: float = 60.0) -> None:
        """Wait for the queued buckets, then end this rank's communication thread and join it.

        A program that ends its process group calls it first, so that no thread is left inside
        torch when the interpreter exits; a later bucket starts a new thread.
        """
        self.wait()
        with _threads_lock:
            thread = _threads.get(_group_key(self.transport))
        if thread is not None:
            thread.stop(timeout)

    def wait(self, timeout: float | None = None, raise_error: bool = True) -> None:
        """Return once every submitted bucket is done.

        Waits in short slices, so that Ctrl-C reaches the caller's thread meanwhile. On CUDA the
        caller's current stream then waits for the pipeline's side streams (whose work is
        already done: this orders the caller's later use of the results in the stream too).

        Args:
            timeout: seconds to wait at most (``None``: no limit).
            raise_error: re-raise a bucket's error (else forget it: its future held it).

        Raises:
            TimeoutError: ``timeout`` passed first.
            Exception: the first error of a bucket since the last :meth:`wait`, re-raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self._in_flight} bucket(s) still in flight")
                self._lock.wait(0.05)
            error, self._error = self._error, None
            sides = list(self._sides)
        for side in sides:
            torch.cuda.current_stream(side.device).wait_stream(side)
        if error is not None and raise_error:
            raise error

    @property
    def idle(self) -> bool:
        """True when no bucket is in flight."""
        with self._lock:
            return self._in_flight == 0

    def take_stats(self) -> dict:
        """Return the record of the buckets done since the last call, and reset.

        Returns:
            The sum of the buckets' records (:func:`compressors.stats.summed`: traffic, ``nnz``
            and ``seconds`` per phase, ``parts`` the buckets' records), with ``buckets`` (the
            same list, its name before 2026-12-07), ``thread_seconds`` and ``cpu_seconds``
            summed. A bucket's record is its synchronizer's call's
            (:func:`compressors.stats.call_record`) with its ``space``, ``numel``,
            ``thread_seconds`` (its time on the communication thread), ``cpu_seconds`` (the
            CPU time that thread spent on it: ``thread_seconds`` less the waits, and less the
            time other threads held the cores) and, where its synchronizer chose its
            configuration itself (SparDL's ``teams="auto"``), ``auto``. A step's when taken
            once per step.
        """
        with self._lock:
            done, self._stats = self._stats, []
        return summed(
            done,
            buckets=done,
            thread_seconds=sum(b["thread_seconds"] for b in done),
            cpu_seconds=sum(b["cpu_seconds"] for b in done),
        )

    # -- the communication thread -----------------------------------------------------------

    def _build(self, space: int):
        def build(numel: int):
            view = TaggedTransport(self.transport, space)
            sync = compressors.create(
                self.method, view, numel=numel, density=self.density, **self.options
            )
            sync.count_nnz = self.count_nnz
            return sync

        return build

    def _job(self, keys, sizes, flat, space, future, cuda):
        def run() -> None:
            try:
                if cuda is None:
                    future.set_result(self._average(keys, sizes, flat, space))
                else:
                    side, ready, producer = cuda
                    with torch.cuda.device(flat.device), torch.cuda.stream(side):
                        side.wait_event(ready)  # the bucket's gradients are written
                        result = self._average(keys, sizes, flat, space)
                        result.record_stream(producer)  # the caller frees it on its stream
                        # Blocks this thread alone, and keeps flat referenced until its last
                        # use; the CUDA-aware future records its event on the side stream.
                        side.synchronize()
                        future.set_result(result)
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                future.set_exception(error)
                self._done(error)
                return
            self._done(None)  # after the result: wait() returning means every value is set

        return run

    def _done(self, error) -> None:
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._in_flight -= 1
            self._lock.notify_all()

    def layout(self, keys, sizes, device=None, space: int = 0) -> Layout:
        """Return the live layout of ``keys`` (built on first use; see :class:`ResidualStore`).

        Call it from the communication thread, or while the pipeline is idle.
        """
        return self.residuals.layout(keys, sizes, self._build(space), device)

    # -- the buckets' residuals (call these while the pipeline is idle) ---------------------

    def synchronizers(self) -> dict:
        """Return the live synchronizers by bucket layout (``"3,4,5"``: its parameters' keys)."""
        return {key: live.sync for key, live in self.residuals.layouts.items()}

    def residual(self, key):
        """Return parameter ``key``'s residual, a flat view of where it lives; None if nowhere."""
        return self.residuals.residual(key)

    def state_dict(self) -> dict:
        """Return the buckets' synchronizer states by layout (:meth:`ResidualStore.state_dict`).

        Collective-free: this rank's residuals (and thresholds...) by parameter.
        """
        return self.residuals.state_dict()

    def load_state_dict(self, buckets: dict) -> None:
        """Restore a :meth:`state_dict`; the layouts pick their residuals up when next built.

        Raises:
            ValueError: a saved bucket is malformed (:meth:`ResidualStore.load_state_dict`).
        """
        self.residuals.load_state_dict(buckets)

    def _average(self, keys, sizes, flat: torch.Tensor, space: int) -> torch.Tensor:
        if sum(sizes) != flat.numel():
            raise RuntimeError(
                f"bucket {space}: {flat.numel()} entries for parameters of {sum(sizes)}"
            )
        live = self.layout(keys, sizes, flat.device, space)
        start = (time.perf_counter(), time.thread_time())
        if self.skip_nonfinite:
            # One pass, no n-sized mask: the sum is NaN or inf when an entry is, and otherwise
            # only for values near float32's limit, which the float32 call would overflow too.
            flag = (~torch.isfinite(flat.sum(dtype=torch.float32))).float().reshape(1)
            live.sync.reset_traffic()
            if live.sync.allreduce_sum_(flag).item() > 0:
                skipped = call_record(live.sync.traffic_counts(), None, {})
                self._note(space, flat.numel(), skipped, start)
                return torch.full_like(flat, float("nan"))
        grad = flat if flat.dtype == torch.float32 else flat.float()
        averaged = live.sync.allreduce(grad, out=live.out)
        self._note(space, flat.numel(), live.sync.stats, start)
        return averaged if flat.dtype == torch.float32 else averaged.to(flat.dtype)

    def _note(self, space, numel, record: dict, start) -> None:
        """Keep bucket ``space``'s ``record`` (its call's, or a skipped bucket's check's)."""
        with self._lock:
            self._stats.append(
                {
                    **record,
                    "space": space,
                    "numel": numel,
                    "thread_seconds": time.perf_counter() - start[0],
                    "cpu_seconds": time.thread_time() - start[1],
                }
            )
