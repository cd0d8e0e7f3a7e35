"""The gradient synchronizers: ``create(name, comm, numel, density, **options)``.

    import compressors
    sync = compressors.create("spardl", comm, numel=n, density=0.01, teams=1, sag="bruck")
    avg = sync.allreduce(grad)

``available()`` lists the names. Each method is one short module that registers itself with
``compressors.registry.register``; the registry (its options, their checks and the conversion
of ``KEY=VALUE`` text) lives in :mod:`compressors.registry`, re-exported here.
"""

from . import dense, gaussiank, gtopk, oktopk, spardl, topk, topkdsa, zen  # noqa: F401 - they register themselves
from .base import Synchronizer
from .registry import (
    available,
    check_options,
    convert_option,
    create,
    option_choices,
    option_defaults,
    options,
    parse_option,
    parse_options,
    register,
    resolve,
    split_option,
    try_options,
)
from .reshard import reshard
from .selection import Selector
from .state import FeedbackState

__all__ = [
    "Synchronizer",
    "FeedbackState",
    "reshard",
    "Selector",
    "create",
    "available",
    "options",
    "option_defaults",
    "option_choices",
    "check_options",
    "try_options",
    "split_option",
    "parse_option",
    "convert_option",
    "parse_options",
    "register",
    "resolve",
]
