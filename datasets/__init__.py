"""Data sets by name.

``datasets.load(name, data_dir)`` returns a ``DataSplit`` (train and test ``torch.utils.data``
datasets yielding ``(image, label)``, the number of classes and the image shape). Missing files
raise ``DataError`` whose message says exactly which files to put where. Data sets know nothing
about distribution or gradient synchronization: sharding is the trainer's job.
"""
from datasets.registry import available, download, load
from datasets.split import DataError, DataSplit

__all__ = ["DataError", "DataSplit", "available", "download", "load"]
