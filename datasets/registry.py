"""The name -> loader table behind ``datasets.load`` and ``datasets.download``.

Loaders are named by module and imported on first use: scikit-learn and torchvision each add
seconds to the start-up of every rank, which runs on other data should not pay.
"""

import importlib
import inspect
import os
from pathlib import Path

from datasets.split import DataError

# name: (module, loader function, downloader function or None)
_LOADERS = {
    "digits": ("datasets.digits", "load", None),
    "mnist": ("datasets.mnist", "load_mnist", "download_mnist"),
    "fashion-mnist": ("datasets.mnist", "load_fashion_mnist", "download_fashion_mnist"),
    "cifar10": ("datasets.cifar", "load_cifar10", "download_cifar10"),
    "cifar100": ("datasets.cifar", "load_cifar100", "download_cifar100"),
    "imagenet": ("datasets.imagenet", "load", None),
    "synthetic-cifar10": ("datasets.synthetic", "load_cifar10_shaped", None),  # timing only
    "imdb": ("datasets.imdb", "load", None),
    "wikipedia": ("datasets.wikipedia", "load", None),
}
# What the data sets are for; the others are image classification.
_TASKS = {"imdb": "text-classification", "wikipedia": "masked-lm"}
# The data sets that read no files: their loaders ignore the data directory.
_NO_FILES = {"digits", "synthetic-cifar10"}
#: The folder below the user's cache directory where caches go (``default_cache_dir``).
CACHE_NAME = "spardl-repro"


def available():
    """Return the sorted list of data set names ``load`` accepts."""
    return sorted(_LOADERS)


def task(name):
    """What data set ``name`` trains: ``image-classification``, ``text-classification`` (imdb)
    or ``masked-lm`` (wikipedia: masked-language-model pre-training)."""
    _entry(name)
    return _TASKS.get(name, "image-classification")


def reads_files(name):
    """Whether data set ``name`` reads files from its data directory (``digits`` ships with
    scikit-learn and ``synthetic-cifar10`` is generated: both ignore it)."""
    _entry(name)
    return name not in _NO_FILES


def default_cache_dir():
    """Where caches go unless told otherwise: ``$XDG_CACHE_HOME/spardl-repro``, or
    ``~/.cache/spardl-repro`` (never the data directory, which may belong to someone else)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, CACHE_NAME)


def options(name):
    """The names of the keyword options data set ``name``'s loader takes (the config file's
    ``data_options``: vocabulary size, sequence length, ...)."""
    return [key for key in _parameters(name)[1:] if key != "cache_dir"]


def load(name, data_dir, cache_dir=None, **settings):
    """Load data set ``name`` from directory ``data_dir`` (ignored by ``digits`` and
    ``synthetic-cifar10``), passing the loader the keyword ``settings`` (see ``options``).

    ``cache_dir``: where a data set that caches its preparation (the text data sets' tokens)
    keeps it (default: ``default_cache_dir()``); nothing is written inside ``data_dir``.

    Returns a ``DataSplit``. Raises ``ValueError`` for an unknown name and ``DataError`` for an
    option the loader does not take, and when files are missing or damaged, labels lie outside
    the classes, or a part holds no samples.
    """
    module, loader, _ = _entry(name)
    unknown = sorted(set(settings) - set(options(name)))
    if unknown:
        raise DataError(
            f"data set {name} takes no option(s) {', '.join(unknown)} "
            f"(valid: {', '.join(options(name)) or 'none'})"
        )
    if "cache_dir" in _parameters(name):
        settings = dict(settings, cache_dir=cache_dir or default_cache_dir())
    split = getattr(module, loader)(data_dir, **settings)
    empty = [part for part in ("train", "test") if len(getattr(split, part)) == 0]
    if empty:
        raise DataError(f"{name} in {data_dir}: the {' and '.join(empty)} part holds no images")
    return split


def download(name, data_dir):
    """Fetch data set ``name`` into ``data_dir`` in torchvision's layout (needs the internet).

    ``digits`` ships with scikit-learn and needs nothing. ImageNet cannot be downloaded and
    raises ``DataError``, as does any failed download, which first removes the directories it
    created that are still empty.
    """
    module, _, downloader = _entry(name)
    if name == "imagenet":
        raise DataError(
            "ImageNet cannot be downloaded automatically; "
            + module.LAYOUT.replace("DATA_DIR", str(data_dir))
        )
    if downloader is not None:
        top = Path(data_dir).absolute()
        before = _directories(top)
        try:
            getattr(module, downloader)(data_dir)
        except (
            OSError,
            RuntimeError,
        ) as error:  # urllib's errors; torchvision's failed mirrors and checksums
            _remove_empty(_directories(top) - before)
            raise DataError(f"downloading {name} into {data_dir} failed: {error}") from error


def _directories(top, depth=2):
    """``top``, the directories at most ``depth`` levels below it (torchvision's downloads create
    ``DATA_DIR/MNIST/raw`` at the deepest) and its parents: those that exist."""
    found = {parent for parent in top.parents if parent.is_dir()}
    level = [top] if top.is_dir() else []
    for _ in range(depth):  # the deepest level is listed, not scanned (in a data directory it
        found.update(level)  # may hold ImageNet's class folders of 1,300 files each)
        level = [
            Path(entry.path)
            for directory in level
            for entry in os.scandir(directory)
            if entry.is_dir(follow_symlinks=False)
        ]
    return found | set(level)


def _remove_empty(directories):
    """Remove those of ``directories`` that hold nothing, deepest first."""
    for directory in sorted(directories, key=lambda path: len(path.parts), reverse=True):
        try:
            directory.rmdir()
        except OSError:  # it holds something: keep it
            pass


def _parameters(name):
    module, loader, _ = _entry(name)
    return list(inspect.signature(getattr(module, loader)).parameters)


def _entry(name):
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of: {', '.join(available())}")
    module, loader, downloader = _LOADERS[name]
    return importlib.import_module(module), loader, downloader
