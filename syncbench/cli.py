"""Command-line helpers shared by the benchmark and the simulator: checks that turn bad values
into usage errors (exit status 2) before a long run, and an argument parser that speaks from
the first MPI rank only.
"""

from __future__ import annotations

import argparse
import os

import compressors


def launched_rank_and_size() -> tuple:
    """This process's rank and the job's size as mpiexec (MPICH's Hydra or Open MPI) gave them in
    the environment, readable before MPI starts; ``(0, 1)`` without a launcher.
    """
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


class RankZeroParser(argparse.ArgumentParser):
    """An argument parser that prints (help, usage errors) from the first rank only: under
    mpiexec every rank parses the same command line and exits alike, and one copy is enough.
    """

    def _print_message(self, message, file=None):
        if launched_rank_and_size()[0] == 0:
            super()._print_message(message, file)


def usage_checked(parser: argparse.ArgumentParser, check, *values):
    """``check(*values)``, a ``ValueError`` turned into the parser's usage error (exit status 2)."""
    try:
        return check(*values)
    except ValueError as error:
        parser.error(str(error))


def method_names(text: str) -> list:
    """The registry names of ``--methods`` (``all``, or names and aliases, comma-separated),
    repeats dropped; ``ValueError`` naming the valid ones for an unknown name.
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


def choices(text: str, flag: str, valid: tuple) -> tuple:
    """The comma-separated words of ``flag``, each one of ``valid``, repeats dropped;
    ``ValueError`` naming the valid ones otherwise.
    """
    words = tuple(dict.fromkeys(word.strip() for word in text.split(",") if word.strip()))
    unknown = [word for word in words if word not in valid]
    if not words or unknown:
        raise ValueError(f"{flag} takes a comma-separated list of {', '.join(valid)}; got {text!r}")
    return words


def output_file(path: str, flag: str) -> str:
    """``path`` if a file can be written there; ``ValueError`` (checked before a long run, not
    after it) when its directory is missing or not writable, or the path is a directory.
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
    """``--plot``'s :func:`output_file`, and ``ValueError`` unless the name ends in a format
    matplotlib writes (checked before a long run: it would fail only when the plot is saved).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if os.path.splitext(path)[1].lstrip(".").lower() not in formats:
        raise ValueError(
            f"--plot {path}: the name must end in an image format: "
            f"{', '.join('.' + name for name in sorted(formats))}"
        )
    return output_file(path, "--plot")


def check_seed(seed: int) -> int:
    """``seed`` if it is >= 0 (NumPy's seeds are), else ``ValueError``."""
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    return seed
