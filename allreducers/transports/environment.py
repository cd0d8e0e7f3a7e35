"""Thread and MPI progress defaults for ranks that share a host's cores.

Ranks that outnumber the cores they run on slow each other down twice over: each rank's
OpenMP pool (torch's intra-op threads) starts one thread per core, and MPICH's ranks busy-poll
while they wait for a message, taking the core that the rank they wait for needs. Call
:func:`apply_launch_defaults` at the start of a program, before MPI starts (before the first
``from mpi4py import MPI``) and preferably before ``import torch``; every variable the user set
stays as it is.

The number of ranks on this host is read from the launcher's environment, since MPI cannot be
asked before it starts: ``MPI_LOCALNRANKS`` (MPICH's Hydra), ``OMPI_COMM_WORLD_LOCAL_SIZE``
(Open MPI), ``SLURM_NTASKS_PER_NODE`` (srun), else ``PMI_SIZE`` (all ranks, as if on one host),
else 1 (started without a launcher).
"""

from __future__ import annotations

import json
import os
import sys

__all__ = [
    "LOCAL_RANK_COUNTS",
    "YIELD",
    "local_ranks",
    "launch_defaults",
    "apply_launch_defaults",
    "CLUSTER_VARIABLE",
    "cluster_topology",
]

#: Launcher variables holding the number of ranks on this host, most specific first.
LOCAL_RANK_COUNTS = (
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "PMI_SIZE",
)
#: MPICH's waiting ranks yield the core after one poll, and yield it to other processes.
YIELD = {"MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def local_ranks(environ=os.environ) -> int:
    """Return the number of ranks on this host, from the first launcher variable set."""
    for name in LOCAL_RANK_COUNTS:
        value = environ.get(name, "").split("(")[0]  # SLURM may write "4(x2)"
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launch_defaults(cores: int, ranks: int) -> dict:
    """Return the environment defaults for ``ranks`` ranks on ``cores`` cores.

    ``OMP_NUM_THREADS`` is the cores' share of each rank (at least 1); MPICH's yield settings
    are added when the ranks outnumber the cores.
    """
    defaults = {"OMP_NUM_THREADS": str(max(1, cores // ranks))}
    if ranks > cores:
        defaults.update(YIELD)
    return defaults


def apply_launch_defaults(environ=os.environ) -> dict:
    """Set :func:`launch_defaults` for this host where the user set nothing.

    If torch is already imported, its OpenMP pool was sized when it loaded, so the thread
    count is also applied through ``torch.set_num_threads``.

    Args:
        environ: this process's environment, or a dict to fill.

    Returns:
        The variables set.

    Raises:
        RuntimeError: MPI has already started in this process (MPICH read its settings then).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    own = environ is os.environ
    if own and mpi is not None and mpi.Is_initialized():
        raise RuntimeError(
            "apply_launch_defaults() must run before MPI starts (before the first "
            "'from mpi4py import MPI')"
        )
    cores = len(os.sched_getaffinity(0))
    chosen = {
        name: value
        for name, value in launch_defaults(cores, local_ranks(environ)).items()
        if name not in environ
    }
    environ.update(chosen)
    if own and "OMP_NUM_THREADS" in chosen and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(chosen["OMP_NUM_THREADS"]))
    return chosen


#: Set by scripts/cluster_network.sh: the emulated cluster's topology, as a JSON object.
CLUSTER_VARIABLE = "SPARDL_CLUSTER"


def cluster_topology(environ=os.environ) -> dict | None:
    """Return the emulated cluster a run is on, as ``scripts/cluster_network.sh`` describes it.

    Returns:
        ``{"hosts": N, "ranks_per_host": G, "rates": [...], "delay": ...}`` from
        ``SPARDL_CLUSTER``; ``None`` outside such a cluster (one machine, or one shaped link).

    Raises:
        ValueError: the variable is set but is not a JSON object naming the hosts.
    """
    value = environ.get(CLUSTER_VARIABLE)
    if not value:
        return None
    try:
        described = json.loads(value)
    except json.JSONDecodeError:
        described = None
    if not isinstance(described, dict) or "hosts" not in described:
        raise ValueError(f"{CLUSTER_VARIABLE}={value!r} is not a JSON object with a 'hosts' key")
    return described
