"""Transports: how ranks exchange tensors (MPI, in-process threads), with traffic accounting.

``as_transport(obj)`` turns what a user passes as ``comm`` (an ``mpi4py`` communicator or a
transport) into a :class:`Transport`. Nothing here knows any synchronization method.
"""

from .base import Incoming, Outgoing, Traffic, Transport
from .local import GroupAborted, LocalGroup, LocalTransport, local_group
from .tagged import TAG_STRIDE, TaggedTransport


def as_transport(comm) -> Transport:
    """Return ``comm`` as a :class:`Transport`.

    A transport stays as it is; an ``mpi4py`` communicator or a ``torch.distributed`` process
    group is wrapped.

    Raises:
        TypeError: ``comm`` is none of these.
    """
    if isinstance(comm, Transport):
        return comm
    import torch.distributed as dist

    if dist.is_available() and isinstance(comm, dist.ProcessGroup):
        from .torchdist import TorchDistributedTransport

        return TorchDistributedTransport(comm)
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - mpi4py is a requirement
        MPI = None
    if MPI is not None and isinstance(comm, MPI.Comm):
        from .mpi import MPITransport

        return MPITransport(comm)
    raise TypeError(
        "comm must be an mpi4py communicator, a torch.distributed process group or an "
        f"allreducers.transports.Transport, got {type(comm).__name__}"
    )


__all__ = [
    "Traffic",
    "Transport",
    "Outgoing",
    "Incoming",
    "LocalGroup",
    "LocalTransport",
    "GroupAborted",
    "local_group",
    "as_transport",
    "TaggedTransport",
    "TAG_STRIDE",
]
