"""Stopping a run on every rank at the same step: Ctrl-C, and a diverged loss or gradient.

Under ``mpiexec`` a Ctrl-C reaches every rank (MPICH's launcher forwards SIGINT), but each rank
at a different point: one computing, another waiting inside an MPI collective, where Python
cannot act on the signal until the call returns. A rank that simply raised would leave the
others waiting for it forever. So, while training, SIGINT only sets a flag (:class:`Interrupt`),
and once per iteration, before the gradient is synchronized, the ranks agree on a few flags
with one all-reduce of three bytes (:func:`agree_flags`): any rank interrupted, any loss not
finite, any gradient holding NaN or inf. When one is set, every rank raises :class:`Stopped`
at the same step, leaves its collectives together and exits normally; rank 0 prints one line.
A second Ctrl-C does not wait for that point: it raises ``KeyboardInterrupt`` at once.
"""

import math
import signal
import threading
from contextlib import contextmanager

import numpy as np
import torch
from mpi4py import MPI

#: The exit status of a process ended by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 128 + signal.SIGINT
DIVERGED = 1


class Stopped(Exception):
    """Every rank stops at the same step; ``status`` is the exit status, ``str()`` the one line
    rank 0 prints."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class Interrupt:
    """Ctrl-C (SIGINT), remembered while :meth:`deferred` is active instead of raised.

    ``requested`` says whether one arrived. A second one while the first waits, or one outside
    :meth:`deferred`, raises ``KeyboardInterrupt`` as Python does by default.
    """

    def __init__(self):
        self.requested = False
        self._deferring = False

    @contextmanager
    def deferred(self):
        """Remember SIGINT during the body (from the main thread only: elsewhere Python
        delivers no signals, and the body runs unchanged)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            signal.signal(signal.SIGINT, previous)

    def _handle(self, signum, frame):
        if self._deferring and not self.requested:
            self.requested = True
            return
        raise KeyboardInterrupt


def agree_flags(comm, interrupted, loss=0.0, gradient=None):
    """``(interrupted, loss not finite, gradient not finite)``, each true if so on any rank
    (collective: one all-reduce of three bytes).

    The gradient is checked through its sum, one vectorized pass: NaN and inf propagate into
    it (an overflow of the sum to inf means values near float32's limit: diverged as well).
    """
    flags = np.array(
        [
            interrupted,
            not math.isfinite(loss),
            gradient is not None and not bool(torch.isfinite(gradient.sum())),
        ],
        dtype=np.uint8,
    )
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    return tuple(bool(flag) for flag in flags)
