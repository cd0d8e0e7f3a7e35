"""The registry of gradient synchronizers: ``create(name, comm, numel, density, **options)``.

    import compressors
    sync = compressors.create("spardl", comm, numel=n, density=0.01, teams=1, sag="bruck")
    avg = sync.allreduce(grad)

``available()`` lists the names. Each method is one short module registered below.
"""

from __future__ import annotations

import inspect

from .base import Synchronizer, check_density
from .selection import Selector

_REGISTRY: dict = {}
_ALIASES: dict = {}


def register(name: str, *aliases: str, description: str = ""):
    """Class decorator adding a :class:`Synchronizer` subclass under ``name`` (and aliases)."""

    def add(cls):
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"synchronizer name {key!r} is registered twice")
        cls.name = name
        cls.description = description or (cls.__doc__ or "").strip().splitlines()[0]
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return add


def available() -> list:
    """The registered method names (aliases excluded), sorted."""
    return sorted(_REGISTRY)


def resolve(name: str) -> type:
    """The class registered as ``name`` or one of its aliases; ``ValueError`` otherwise."""
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        names = ", ".join(available() + sorted(_ALIASES))
        raise ValueError(f"unknown synchronization method {name!r}; valid: {names}")
    return _REGISTRY[key]


def options(name: str) -> list:
    """The keyword options that method ``name`` accepts besides comm, numel and density."""
    parameters = inspect.signature(resolve(name).__init__).parameters
    return [p for p in parameters if p not in ("self", "comm", "numel", "density")]


def option_defaults(name: str) -> dict:
    """The default value of each option of method ``name`` (see :func:`options`)."""
    parameters = inspect.signature(resolve(name).__init__).parameters
    return {option: parameters[option].default for option in options(name)}


def option_choices(name: str) -> dict:
    """The valid values of method ``name``'s options that take one of a few names."""
    return dict(resolve(name).choices)


def check_options(name: str, workers: int, **method_options) -> dict:
    """Check method ``name``'s options for a run on ``workers`` ranks, without building it.

    Returns:
        The options converted to the method's types.

    Raises:
        ValueError: an unknown option (the message names the valid ones) or an invalid value.
    """
    valid = options(name)
    unknown = sorted(set(method_options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for {name!r}; valid: {', '.join(valid)}")
    return resolve(name).check_options(workers, **method_options)


def create(name: str, comm, numel: int, density: float = 0.01, **method_options) -> Synchronizer:
    """Build the synchronizer ``name`` for a flat gradient of ``numel`` elements.

    ``comm``: an ``mpi4py`` communicator or a ``comm.Transport`` (e.g. a rank of
    ``allreducers.transports.local_group(P)``). Unknown names, densities outside (0, 1] and unknown or invalid
    options raise ``ValueError`` naming the valid choices.
    """
    cls = resolve(name)
    check_density(density)
    valid = options(name)
    unknown = sorted(set(method_options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for {name!r}; valid: {', '.join(valid)}")
    return cls(comm, numel=numel, density=density, **method_options)


from . import dense, gaussiank, gtopk, oktopk, spardl, topk, topkdsa  # noqa: E402,F401  (registration happens on import)

__all__ = [
    "Synchronizer",
    "Selector",
    "create",
    "available",
    "options",
    "option_defaults",
    "option_choices",
    "check_options",
    "register",
    "resolve",
]
