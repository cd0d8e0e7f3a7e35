"""Data sets by name.

``datasets.load(name, data_dir)`` returns a ``DataSplit`` (train and test ``torch.utils.data``
datasets yielding ``(image, label)``, the number of classes and the image shape). The text
data sets ``imdb`` and ``wikipedia`` yield token indices and return a ``TextSplit``
(``datasets.text``), with the vocabulary's size; ``datasets.task(name)`` says what a data set
trains. Missing files
raise ``DataError`` whose message says exactly which files to put where. Data sets know nothing
about distribution or gradient synchronization: sharding is the trainer's job.
"""

from datasets.registry import available, download, load, options, task
from datasets.split import DataError, DataSplit

__all__ = ["DataError", "DataSplit", "available", "download", "load", "options", "task"]
