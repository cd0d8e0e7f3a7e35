"""Collective helpers of the trainer: agreeing on usage errors, aborting on failures,
broadcasting tensors and summing numbers over ranks (``allreducers.transports.placement`` places a
rank on cores and devices).

All of them take an ``mpi4py`` communicator and are called by every rank.
"""

import traceback
from contextlib import contextmanager

from allreducers.transports.lifecycle import report_and_abort
from datasets.split import DataError

_DATA_ERROR = f"{DataError.__module__}.{DataError.__name__}"


class UsageError(Exception):
    """Bad input from the user: reported once by rank 0, every rank exits with status 2."""


def agree(comm, problem):
    """Raise ``UsageError`` on every rank if any rank has a ``problem`` (a message or None).

    Collective, so a problem seen by one rank only (a data directory missing on one host) still
    stops everybody; the message of the lowest such rank is used.
    """
    for message in comm.allgather(problem):
        if message:
            raise UsageError(message)


@contextmanager
def abort_on_error(comm):
    """Print this rank's traceback and abort the whole job if the body raises.

    A ``DataError`` (bad data found during training) is printed as its one line instead.

    Without this, the other ranks would wait forever in their next collective
    (``allreducers.transports.mpi.report_and_abort`` gives the launcher time to forward the report
    first).
    """
    try:
        yield
    except Exception as error:  # noqa: BLE001 - any failure must end every rank
        if isinstance(error, DataError):  # bad data met in training (an unreadable image)
            # A loader worker's error arrives with its traceback in the message; the last line
            # is the original one.
            line = str(error).strip().splitlines()[-1].removeprefix(f"{_DATA_ERROR}: ")
            report = f" {line}\n"
        else:
            report = f"\n{traceback.format_exc()}"
        report_and_abort(comm, f"rank {comm.Get_rank()} failed:{report}")


def broadcast_tensors(tensors, comm, root=0):
    """Overwrite every tensor in ``tensors`` (any device) with ``root``'s values, in place."""
    for tensor in tensors:
        host = tensor.detach().cpu()
        comm.Bcast(host.numpy(), root=root)
        if tensor.device.type != "cpu":
            tensor.detach().copy_(host)


def sum_over_ranks(comm, values):
    """Return the element-wise sum of the list of floats ``values`` over all ranks.

    Summed in rank order from an all-gather, so every rank gets bit-identical numbers.
    """
    totals = [0.0] * len(values)
    for rank_values in comm.allgather([float(value) for value in values]):
        totals = [total + value for total, value in zip(totals, rank_values)]
    return totals
