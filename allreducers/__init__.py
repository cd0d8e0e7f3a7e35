"""Communication schedules as pure functions, and the one engine that runs them.

- :mod:`.schedule`: the :class:`Step` record and small helpers.
- :mod:`.srs`: Spar-Reduce-Scatter, round by round or block by block.
- :mod:`.gather`: the Bruck all-gather (the final gather and B-SAG).
- :mod:`.halving`: recursive-halving pair exchanges (R-SAG).
- :mod:`.engine`: :func:`run_schedule`, :func:`allgather_lists`, :func:`allgather_rows`,
  :class:`MessageBuffers`.
- :mod:`.wire`: the codec, which owns the bytes of every message (ZEN's partitions included):
  value formats x layouts, a package.
- :mod:`.device`: :func:`device_tensor`, host integers on a device without a wait.
- :mod:`.checks`: :func:`check_choice`, the one check of an option that names one of a few.
- :mod:`.regions`: windowed split-and-reduce over regions (Ok-Topk's second engine).
- :mod:`.hashing`: ZEN's hash partition of the indices among the ranks.
- :mod:`.transports`: MPI, torch.distributed and in-process transports.
"""

from .checks import check_choice
from .device import device_tensor
from .engine import (
    MessageBuffers,
    PhaseTimer,
    allgather_joined,
    allgather_lists,
    allgather_regions,
    allgather_rows,
    allgather_rows_in_order,
    index_add_in_order,
    run_schedule,
)
from .gather import bruck_allgather_schedule
from .halving import recursive_halving_schedule
from .regions import RegionReducer, run_windowed
from .rotation import rotation_schedule
from .schedule import Step, ceil_log2, cyclic
from .srs import srs_block_schedule, srs_round_shapes, srs_schedule
from .tree import binomial_broadcast_schedule, binomial_reduce_schedule
from .wire import WIRES, Codec, PartitionCodec, check_wire, codec

__all__ = [
    "Step",
    "ceil_log2",
    "cyclic",
    "srs_schedule",
    "srs_block_schedule",
    "srs_round_shapes",
    "bruck_allgather_schedule",
    "recursive_halving_schedule",
    "run_schedule",
    "allgather_lists",
    "allgather_rows",
    "allgather_regions",
    "allgather_rows_in_order",
    "allgather_joined",
    "index_add_in_order",
    "MessageBuffers",
    "PhaseTimer",
    "rotation_schedule",
    "binomial_reduce_schedule",
    "binomial_broadcast_schedule",
    "run_windowed",
    "RegionReducer",
    "WIRES",
    "Codec",
    "codec",
    "device_tensor",
    "check_wire",
    "check_choice",
    "PartitionCodec",
]
