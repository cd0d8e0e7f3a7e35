"""Communication schedules as pure functions, and the one engine that runs them.

- :mod:`.schedule`: the :class:`Step` record and small helpers.
- :mod:`.srs`: Spar-Reduce-Scatter rounds for any worker count.
- :mod:`.gather`: Bruck and recursive-doubling all-gathers (the final gather and SAG).
- :mod:`.engine`: :func:`run_schedule`, the sparse message format, :func:`allgather_lists`.
"""
from .engine import PhaseTimer, allgather_lists, pack, run_schedule, unpack
from .gather import bruck_allgather_schedule, recursive_doubling_schedule
from .schedule import Step, ceil_log2, cyclic
from .srs import srs_round_shapes, srs_schedule
from .rotation import rotation_schedule
from .tree import binomial_broadcast_schedule, binomial_reduce_schedule

__all__ = ["Step", "ceil_log2", "cyclic", "srs_schedule", "srs_round_shapes",
           "bruck_allgather_schedule", "recursive_doubling_schedule", "run_schedule",
           "allgather_lists", "pack", "unpack", "PhaseTimer", "rotation_schedule",
           "binomial_reduce_schedule", "binomial_broadcast_schedule"]
