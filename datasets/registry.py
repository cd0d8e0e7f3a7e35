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


def available():
    """Return the sorted list of data set names ``load`` accepts."""
    return sorted(_LOADERS)


def task(name):
    """What data set ``name`` trains: ``image-classification``, ``text-classification`` (imdb)
    or ``masked-lm`` (wikipedia: masked-language-model pre-training)."""
    _entry(name)
    return _TASKS.get(name, "image-classification")


def options(name):
    """The names of the keyword options data set ``name``'s loader takes (the config file's
    ``data_options``: vocabulary size, sequence length, ...)."""
    module, loader, _ = _entry(name)
    return [key for key in inspect.signature(getattr(module, loader)).parameters][1:]


def load(name, data_dir, **settings):
    """Load data set ``name`` from directory ``data_dir`` (ignored by ``digits``), passing the
    loader the keyword ``settings`` (see ``options``).

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


def _entry(name):
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; choose one of: {', '.join(available())}")
    module, loader, downloader = _LOADERS[name]
    return importlib.import_module(module), loader, downloader
