"""Data sets by name.

``datasets.load(name, data_dir)`` returns a ``DataSplit`` (train and test ``torch.utils.data``
datasets yielding ``(image, label)``, the number of classes and the image shape). The text
data sets ``imdb`` and ``wikipedia`` yield token indices and return a ``TextSplit``
(``datasets.text``), with the vocabulary's size; ``datasets.task(name)`` says what a data set
trains; ``datasets.reads_files(name)`` whether it reads its data directory at all. Missing
files raise ``DataError`` whose message says exactly which files to put where. Caches (the text
data sets' tokens) go to a cache directory (``datasets.default_cache_dir()`` unless ``load`` is
given ``cache_dir``), never into the data directory. Data sets know nothing
about distribution or gradient synchronization: sharding is the trainer's job.
"""

from datasets.registry import (
    available,
    default_cache_dir,
    download,
    load,
    options,
    reads_files,
    task,
)
from datasets.split import DataError, DataSplit

__all__ = [
    "DataError",
    "DataSplit",
    "available",
    "default_cache_dir",
    "download",
    "load",
    "options",
    "reads_files",
    "task",
]
