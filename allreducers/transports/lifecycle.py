"""Process-lifecycle policy of an MPI job: what a crash, Ctrl-C and too few threads do.

A rank that dies in the middle of a collective leaves the others waiting forever, and a rank
waiting inside an MPI call never sees a signal. The functions here end the whole job instead:
an uncaught exception aborts it with status 1 after the traceback
(:func:`abort_on_uncaught_exception`, :func:`report_and_abort`), Ctrl-C ends it with status 130
after one line (:func:`end_interrupted`). :func:`require_thread_level` checks that the MPI
library was started with the thread support a background communication thread needs.

The transport (``allreducers.transports.mpi``) installs the exception hook when it is created
and re-exports these names; the policy itself lives here, apart from moving bytes.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from mpi4py import MPI

__all__ = [
    "report_and_abort",
    "end_interrupted",
    "abort_on_uncaught_exception",
    "install_abort_hook",
    "thread_level_name",
    "require_thread_level",
]

#: How long a failing rank waits between writing its report and aborting the job.
_FORWARD_SECONDS = 1.0

#: How long rank 0 gives the launcher to forward its line before :func:`end_interrupted`
#: ends the job, and the other ranks wait longer, so that it is rank 0 that ends it.
_LINE_SECONDS = 0.3

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
    MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
    MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
    MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
}


def report_and_abort(comm: MPI.Comm, message: str) -> None:
    """Write ``message`` to stderr and abort the whole job (status 1).

    The launcher forwards a rank's output through a pipe that ``Abort`` may tear down before it
    is read (seen: a job that ended with status 1 and an empty stderr), so the rank waits
    ``_FORWARD_SECONDS`` between writing and aborting.

    Args:
        comm: the communicator whose ranks all end.
        message: the report, ending with a newline.
    """
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(_FORWARD_SECONDS)
    comm.Abort(1)


def end_interrupted(comm: MPI.Comm = MPI.COMM_WORLD, line: str = "interrupted") -> None:
    """End the whole job after Ctrl-C with exit status 130, rank 0 having written ``line``.

    Ranks waiting inside an MPI call cannot see the signal, and a rank that exits alone makes
    the launcher kill them and report a crash (exit status 9 and a banner). ``Abort(130)``
    instead ends every rank and makes ``mpiexec`` exit with 130; the MPI library's own abort
    message goes to /dev/null, since an interrupt is no error.

    Args:
        comm: the communicator whose ranks all end.
        line: what rank 0 writes to stderr.
    """
    if comm.Get_rank() == 0:
        sys.stderr.write(line + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_LINE_SECONDS if comm.Get_rank() == 0 else 2 * _LINE_SECONDS)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    comm.Abort(130)


def abort_on_uncaught_exception(comm: MPI.Comm = MPI.COMM_WORLD) -> None:
    """Make an uncaught exception on this rank print its traceback and abort the whole job.

    As ``python -m mpi4py`` does, so that no other rank waits forever. ``KeyboardInterrupt``
    (Ctrl-C, which ``mpiexec`` forwards to every rank) ends the job with status 130 instead,
    after one line from rank 0 (:func:`end_interrupted`).

    Args:
        comm: the communicator whose ranks all end.
    """

    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):  # Ctrl-C is no crash: one word, status 130
            end_interrupted(comm)
        text = "".join(traceback.format_exception(kind, value, tb))
        report_and_abort(
            comm, f"[rank {comm.Get_rank()}] uncaught exception, aborting the job:\n{text}"
        )

    sys.excepthook = hook


def install_abort_hook(comm: MPI.Comm) -> bool:
    """Install :func:`abort_on_uncaught_exception` unless the program has a hook of its own.

    Python's default hook is replaced, and so is the one ``torch.distributed`` installs when a
    process group starts (it only prefixes the rank to the default's output, and would swallow
    the report of a hook it wraps). Nothing changes on a single rank.

    Args:
        comm: the communicator whose ranks all end.

    Returns:
        Whether the hook was installed.
    """
    current = sys.excepthook
    replaceable = current is sys.__excepthook__ or (
        getattr(current, "__name__", "") == "_distributed_excepthook"
        and getattr(current, "__module__", "").startswith("torch.distributed")
    )
    if comm.Get_size() > 1 and replaceable:
        abort_on_uncaught_exception(comm)
        return True
    return False


def thread_level_name(level: int) -> str:
    """Return the MPI name of thread support ``level`` (``"MPI_THREAD_SERIALIZED"``)."""
    return _THREAD_LEVELS.get(level, f"thread level {level}")


def require_thread_level(needed: int = MPI.THREAD_SERIALIZED, what: str = "") -> int:
    """Check that MPI runs with at least ``needed`` thread support; return the level it has.

    A communication thread that runs collectives while the main thread computes needs
    ``MPI_THREAD_SERIALIZED``: one thread at a time calls MPI, but not always the main one.
    mpi4py asks for ``MPI_THREAD_MULTIPLE`` unless ``mpi4py.rc.thread_level`` says otherwise.

    Args:
        needed: the least level, one of ``MPI.THREAD_*``.
        what: who needs it, for the message.

    Returns:
        ``MPI.Query_thread()``.

    Raises:
        RuntimeError: MPI was started with less (the message says how to get more).
    """
    level = MPI.Query_thread()
    if level < needed:
        raise RuntimeError(
            f"{what or 'a background communication thread'} needs {thread_level_name(needed)}, "
            f"but MPI was started with {thread_level_name(level)}: leave mpi4py.rc.thread_level "
            f"at its default ('multiple') or set it to 'serialized' before importing "
            "mpi4py.MPI, and use an MPI library built with thread support"
        )
    return level
