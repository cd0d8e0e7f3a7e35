"""The registry of gradient synchronizers, and the conversion of command-line option text.

Each method module registers its class with :func:`register`; :func:`create` builds one by name.
What a command line needs to know about a method comes from here, in one place: its options
(:func:`options`, :func:`option_defaults`, :func:`option_choices`), their checks
(:func:`check_options`, and :func:`try_options`, which also builds the method once for a
gradient of one entry), and the conversion of ``KEY=VALUE`` text to typed options
(:func:`split_option`, :func:`parse_option`, :func:`parse_options`). ``compressors`` re-exports
all of it.

Methods of other packages join through the entry-point group ``compressors.methods``
(:data:`ENTRY_POINTS`): each entry names a module that registers its classes, or a
:class:`Synchronizer` subclass, which is registered under the entry's name. They load at the
first lookup (:func:`available`, :func:`resolve`). docs/ADDING_A_METHOD.md shows both ways in.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings

from . import agreement
from .base import FEEDBACK_OPTIONS, Synchronizer, check_density

__all__ = [
    "ENTRY_POINTS",
    "register",
    "available",
    "resolve",
    "options",
    "option_defaults",
    "option_choices",
    "check_known",
    "check_options",
    "try_options",
    "split_option",
    "parse_option",
    "convert_option",
    "parse_options",
    "create",
]

#: The entry-point group through which other packages add methods.
ENTRY_POINTS = "compressors.methods"

_REGISTRY: dict = {}
_ALIASES: dict = {}
#: Entry points that failed to load: name -> the one-line reason (resolve names it).
_BROKEN: dict = {}
_PLUGINS_LOADED = False


def _entry_points() -> list:
    found = importlib.metadata.entry_points()
    if hasattr(found, "select"):  # Python 3.10 and later
        return list(found.select(group=ENTRY_POINTS))
    return list(found.get(ENTRY_POINTS, ()))  # pragma: no cover - Python 3.9


def _load_plugins() -> None:
    """Load the ``compressors.methods`` entry points once; one that fails is named, not fatal."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for entry in _entry_points():
        try:
            loaded = entry.load()
            if isinstance(loaded, type) and issubclass(loaded, Synchronizer):
                if loaded not in _REGISTRY.values():
                    register(entry.name)(loaded)
            elif entry.name not in _REGISTRY and entry.name not in _ALIASES:
                raise ValueError(f"{entry.value} registered no method named {entry.name!r}")
        except Exception as error:  # a broken plugin must not stop the methods that work
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            _BROKEN[entry.name] = f"{entry.value} ({reason})"
            warnings.warn(
                f"method {entry.name!r} of entry point group {ENTRY_POINTS} did not load: "
                f"{_BROKEN[entry.name]}",
                stacklevel=2,
            )


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
    """The registered method names (aliases excluded, entry points included), sorted."""
    _load_plugins()
    return sorted(_REGISTRY)


def resolve(name: str) -> type:
    """The class registered as ``name`` or one of its aliases; ``ValueError`` otherwise."""
    _load_plugins()
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY and key in _BROKEN:
        raise ValueError(f"synchronization method {name!r} did not load: {_BROKEN[key]}")
    if key not in _REGISTRY:
        names = ", ".join(available() + sorted(_ALIASES))
        raise ValueError(f"unknown synchronization method {name!r}; valid: {names}")
    return _REGISTRY[key]


def options(name: str) -> list:
    """The keyword options that method ``name`` accepts besides comm, numel and density.

    Its constructor's, then (error-feedback methods) ``FEEDBACK_OPTIONS``: ``momentum``,
    ``nesterov`` and ``density_warmup``.
    """
    return list(option_defaults(name))


def option_defaults(name: str) -> dict:
    """The default value of each option of method ``name`` (see :func:`options`)."""
    cls = resolve(name)
    parameters = inspect.signature(cls.__init__).parameters
    defaults = {
        key: parameter.default
        for key, parameter in parameters.items()
        if key not in ("self", "comm", "numel", "density")
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }
    return {**defaults, **(FEEDBACK_OPTIONS if cls.uses_residual else {})}


def option_choices(name: str) -> dict:
    """The valid values of method ``name``'s options that take one of a few names."""
    return dict(resolve(name).choices)


def check_known(name: str, method_options) -> None:
    """Raise ``ValueError`` naming the valid ones unless method ``name`` takes these options."""
    valid = options(name)
    unknown = sorted(set(method_options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for {name!r}; valid: {', '.join(valid)}")


def check_options(name: str, workers: int, **method_options) -> dict:
    """Check method ``name``'s options for a run on ``workers`` ranks, without building it.

    Returns:
        The options converted to the method's types.

    Raises:
        ValueError: an unknown option (the message names the valid ones) or an invalid value.
    """
    check_known(name, method_options)
    return resolve(name).check_options(workers, **method_options)


def try_options(name: str, workers: int, density: float = 1.0, **method_options) -> dict:
    """Check method ``name``'s options as :func:`check_options` does, then build it once.

    The build is rank 0 of an in-process group of ``workers`` ranks, for a gradient of one
    entry: it sends nothing and allocates next to nothing, and it catches the values only the
    method's constructor checks (Ok-Topk's ``in_flight=0``) before a run starts.

    Returns:
        The options converted to the method's types.

    Raises:
        ValueError: an unknown option (the message names the valid ones) or an invalid value.
    """
    from allreducers.transports import local_group

    method_options = check_options(name, workers, **method_options)
    create(name, local_group(workers).rank(0), numel=1, density=density, **method_options)
    return method_options


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def split_option(text: str) -> tuple:
    """Split a command line's ``KEY=VALUE`` into ``(key, value text)``.

    A dash in the key stands for an underscore (``in-flight=2`` is ``in_flight``).

    Raises:
        ValueError: the text has no ``=`` or no key before it.
    """
    key, equals, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not equals or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value.strip()


def parse_option(name: str, key: str, text: str):
    """Convert ``text`` to the type of option ``key``'s default in method ``name``.

    A word of the method's ``option_words`` for ``key`` (spardl's ``teams="auto"``) stays text;
    everything else is :func:`convert_option`'s.

    Raises:
        ValueError: ``key`` is no option of ``name`` (the message names the valid keys), or
            ``text`` is not a value of the option's type.
    """
    words = getattr(resolve(name), "option_words", {}).get(key, ())
    return convert_option(name, key, text, option_defaults(name), words)


def convert_option(owner: str, key: str, text: str, defaults: dict, words=()):
    """Convert ``text`` to the type of ``defaults[key]``.

    The one conversion of every ``KEY=VALUE`` option, a registered method's or another (the
    trainer's DDP methods). A bool takes true/false, yes/no, on/off or 1/0; an int a whole
    number; a float any number; a str the text itself. Where the default is None: an int, else
    a float, else the text. A text in ``words`` stays text.

    Raises:
        ValueError: ``key`` is not in ``defaults`` (the message names ``owner`` and the valid
            keys), or ``text`` is not a value of the option's type.
    """
    if key not in defaults:
        raise ValueError(
            f"{owner} has no option {key!r}; valid keys: {', '.join(defaults) or 'none'}"
        )
    if text in words:  # a word the option takes besides its type's values (spardl's teams=auto)
        return text
    default = defaults[key]
    if isinstance(default, bool):
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        kind = "true or false"
    elif isinstance(default, (int, float)):
        kind = "a whole number" if isinstance(default, int) else "a number"
        try:
            return type(default)(text)
        except ValueError:
            pass
    elif isinstance(default, str):
        return text
    else:  # None, or a default of another type: the first of int, float and str that fits
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                pass
        return text
    raise ValueError(f"{owner}'s {key} takes {kind} (default {default!r}), got {text!r}")


def parse_options(name: str, texts) -> dict:
    """The options of method ``name`` that ``KEY=VALUE`` strings ``texts`` give, typed.

    Each value is converted by :func:`parse_option`; a later key repeated wins.

    Raises:
        ValueError: a text that is not ``KEY=VALUE``, an unknown key (the message names the
            valid keys) or a value of the wrong type.
    """
    parsed = {}
    for text in texts:
        key, value = split_option(text)
        parsed[key] = parse_option(name, key, value)
    return parsed


def create(name: str, comm, numel: int, density: float = 0.01, **method_options) -> Synchronizer:
    """Build the synchronizer ``name`` for a flat gradient of ``numel`` elements.

    ``comm``: an ``mpi4py`` communicator or an ``allreducers.transports.Transport`` (e.g. a
    rank of ``allreducers.transports.local_group(P)``). Unknown names, densities outside (0, 1] and
    unknown or invalid options raise ``ValueError`` naming the valid choices.
    """
    cls = resolve(name)
    check_density(density)
    check_known(name, method_options)
    own = {key: value for key, value in method_options.items() if key not in FEEDBACK_OPTIONS}
    sync = cls(comm, numel=numel, density=density, **own)
    feedback = {key: value for key, value in method_options.items() if key in FEEDBACK_OPTIONS}
    if feedback:  # DGC's momentum correction and density warm-up (Synchronizer.set_feedback)
        transport = sync.transport

        def rebuild(stage_density):
            stage = cls(transport, numel=numel, density=stage_density, **own)
            stage.count_nnz = sync.count_nnz
            return stage

        sync.set_feedback(**feedback, rebuild=rebuild)
    # What every rank must share: compared in one small collective at the first call
    # (compressors.agreement), so that ranks that differ get one clear error each.
    sync.agreement = agreement.settings(name, numel, density, method_options)
    return sync
