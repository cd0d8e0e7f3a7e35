"""Command-line helpers shared by the benchmark and the simulator.

Checks that turn bad values into usage errors (exit status 2) before a long run, and an argument
parser that speaks from the first MPI rank only.
"""

from __future__ import annotations

import argparse
import os

import compressors

__all__ = [
    "launched_rank_and_size",
    "RankZeroParser",
    "usage_checked",
    "method_names",
    "positive_ints",
    "team_counts",
    "choices",
    "output_file",
    "plot_file",
    "check_density",
    "check_seed",
    "method_options",
    "local_ranks",
    "available_memory",
    "check_numel",
]


def launched_rank_and_size() -> tuple:
    """This process's rank and the job's size, read before MPI starts.

    As mpiexec (MPICH's Hydra or Open MPI) gave them in the environment; ``(0, 1)`` without a
    launcher.
    """
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


class RankZeroParser(argparse.ArgumentParser):
    """An argument parser that prints (help, usage errors) from the first rank only.

    Under mpiexec every rank parses the same command line and exits alike, and one copy is enough.
    """

    def _print_message(self, message, file=None):
        if launched_rank_and_size()[0] == 0:
            super()._print_message(message, file)

    def error(self, message):
        """Exit with status 2 after one line, ``PROG: error: MESSAGE`` (no usage: ``--help``)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def usage_checked(parser: argparse.ArgumentParser, check, *values):
    """``check(*values)``, a ``ValueError`` turned into the parser's usage error (exit status 2)."""
    try:
        return check(*values)
    except ValueError as error:
        parser.error(str(error))


def method_names(text: str) -> list:
    """The registry names of ``--methods``, repeats dropped.

    ``all``, or names and aliases, comma-separated; ``ValueError`` naming the valid ones for an
    unknown name.
    """
    names = compressors.available() if text == "all" else text.split(",")
    return list(dict.fromkeys(compressors.resolve(name).name for name in names))


def positive_ints(text: str, flag: str) -> list:
    """The comma-separated integers >= 1 of ``flag``, repeats dropped; ``ValueError`` otherwise."""
    try:
        values = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} takes integers >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def team_counts(text: str, flag: str = "--teams") -> list:
    """The comma-separated team counts of ``flag``: integers >= 1 and ``auto``, repeats dropped.

    ``ValueError`` otherwise (``auto``: SparDL chooses d itself, ``compressors.teams``).
    """
    words = [word.strip() for word in text.split(",") if word.strip()]
    try:
        values = [word if word == "auto" else int(word) for word in words]
    except ValueError:
        message = f"{flag} takes comma-separated integers and 'auto', got {text!r}"
        raise ValueError(message) from None
    if not values or any(value != "auto" and value < 1 for value in values):
        raise ValueError(f"{flag} takes integers >= 1 and 'auto', got {text!r}")
    return list(dict.fromkeys(values))


def choices(text: str, flag: str, valid: tuple) -> tuple:
    """The comma-separated words of ``flag``, each one of ``valid``, repeats dropped.

    ``ValueError`` naming the valid ones otherwise.
    """
    words = tuple(dict.fromkeys(word.strip() for word in text.split(",") if word.strip()))
    unknown = [word for word in words if word not in valid]
    if not words or unknown:
        raise ValueError(f"{flag} takes a comma-separated list of {', '.join(valid)}; got {text!r}")
    return words


def output_file(path: str, flag: str) -> str:
    """``path`` if a file can be written there.

    ``ValueError`` (checked before a long run, not after it) when its directory is missing or not
    writable, or the path is a directory.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory")
    if not os.path.isdir(directory):
        raise ValueError(f"{flag} {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")
    return path


def plot_file(path: str) -> str:
    """``--plot``'s :func:`output_file`, in a format matplotlib writes.

    ``ValueError`` unless the name ends in such a format (checked before a long run: it would fail
    only when the plot is saved).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if os.path.splitext(path)[1].lstrip(".").lower() not in formats:
        raise ValueError(
            f"--plot {path}: the name must end in an image format: "
            f"{', '.join('.' + name for name in sorted(formats))}"
        )
    return output_file(path, "--plot")


def check_density(density: float, flag: str = "--density") -> float:
    """``density`` if it lies in (0, 1], else ``ValueError`` naming ``flag``."""
    try:
        return compressors.base.check_density(density)
    except ValueError:
        raise ValueError(f"{flag} must lie in (0, 1], got {density}") from None


def check_seed(seed: int) -> int:
    """``seed`` if it is >= 0 (NumPy's seeds are), else ``ValueError``."""
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    return seed


def method_options(texts: list, methods: list) -> dict:
    """The ``--method-option KEY=VALUE`` texts as options per method of ``methods``.

    A key applies to every method that takes it, converted to the type of that method's default
    (``compressors.parse_option``); methods without it run without it.

    Returns:
        ``{method: {key: value}}`` for every method of ``methods`` (empty where none applies).

    Raises:
        ValueError: a text that is not ``KEY=VALUE``, a key that no method of ``methods`` takes
            (the message names the valid keys), or a value of the wrong type.
    """
    chosen = {name: {} for name in methods}
    for text in texts or []:
        try:
            key, value = compressors.split_option(text)
        except ValueError as error:
            raise ValueError(f"--method-option {text}: {error}") from None
        takers = [name for name in methods if key in compressors.options(name)]
        if not takers:
            valid = sorted({key for name in methods for key in compressors.options(name)})
            raise ValueError(
                f"--method-option {text}: no method of --methods ({', '.join(methods)}) takes "
                f"{key!r}; valid keys: {', '.join(valid) or 'none'}"
            )
        for name in takers:
            try:
                chosen[name][key] = compressors.parse_option(name, key, value)
            except ValueError as error:
                raise ValueError(f"--method-option {text}: {error}") from None
    return chosen


def local_ranks() -> int:
    """The ranks the launcher started on this host.

    MPICH's ``MPI_LOCALNRANKS``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``, else all of them
    (:func:`launched_rank_and_size`).
    """
    for variable in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return launched_rank_and_size()[1]


def available_memory():
    """The bytes of memory this host can still give (``MemAvailable``), ``None`` if unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_numel(numel: int, methods: list, buffers: int, flag: str = "--numel") -> int:
    """``numel``, checked against the methods' index range and the memory.

    ``numel`` if every method of ``methods`` addresses it and ``buffers`` float32 buffers of that
    length fit in this host's available memory; ``ValueError`` otherwise.

    Checked before anything is allocated: a gradient too long for a method's int32 indices
    (its class's ``max_numel``; ``None``: no limit) or for the memory would otherwise end in a
    rank killed by the kernel. ``buffers`` is a lower bound of what the run holds at once over
    the ranks on this host, so a run refused here could not have fitted.
    """
    if numel < 1:
        raise ValueError(f"{flag} must be >= 1, got {numel}")
    limits = {name: compressors.resolve(name).max_numel for name in methods}
    over = [name for name, limit in limits.items() if limit is not None and numel > limit]
    if over:
        limit = min(limits[name] for name in over)
        raise ValueError(
            f"{flag} {numel} is above {limit:,}, the most entries {', '.join(over)} "
            f"address (int32 indices); use a smaller {flag}"
            + (
                f" or --methods {','.join(n for n in methods if n not in over)}"
                if len(over) < len(methods)
                else ""
            )
        )
    needed, available = 4 * numel * buffers, available_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"{flag} {numel} needs at least {needed / 1e9:.1f} GB of memory on this host "
            f"({buffers} float32 buffers of n entries over its ranks), more than the "
            f"{available / 1e9:.1f} GB available; use a smaller {flag}, --sequential or fewer "
            "--methods"
        )
    return numel
