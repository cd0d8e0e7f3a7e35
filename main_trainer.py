"""Data-parallel training with sparse gradient synchronization: the command line.

    mpiexec -n N python main_trainer.py [--dnn NAME] [--dataset NAME] [--compression
        --compressor NAME --density D] ...

With no flags it trains a small CNN on scikit-learn's 8x8 digits (offline, about a minute on
2 CPU cores). Every flag is described by ``--help`` and in docs/TRAINING.md. This file only
starts and ends the run: the flags and their checks live in ``trainer.cli``, building the run in
``trainer.build``, the training loop in ``trainer.loop``.
Bad input ends every rank with exit status 2 and one message from rank 0; a failure during
training prints the failing rank's traceback and aborts the whole job. A diverged run (a loss or
gradient not finite) ends every rank at the same step with status 1 and one line from rank 0;
Ctrl-C likewise, with status 130 and a line naming the step and the last complete checkpoint.
"""

# ruff: noqa: E402 - Ctrl-C's handler and MPI's launch defaults come before the imports below
import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C during the seconds of imports below: status 130, no traceback
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from allreducers.transports.environment import apply_launch_defaults

if __name__ == "__main__":
    # Threads per rank and MPICH's yielding while waiting, where the user set nothing: before
    # MPI starts, which the mpi4py import below does.
    apply_launch_defaults()

from mpi4py import MPI

from allreducers.transports.lifecycle import end_interrupted
from trainer.build import build_trainer
from trainer.distributed import UsageError, abort_on_error
from trainer.stopping import INTERRUPTED, Stopped

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on: main()'s handling


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
