"""Shared pieces of the text data sets: the split record, padded batches, the tokenised cache.

Tokenising a corpus in Python takes minutes; the result is cached in the cache directory
(``--cache-dir``; ``datasets.default_cache_dir()`` by default, never the data directory) in
one file named by the data set and a hash of the source files (absolute folder, relative path,
size, modification time) and the settings, written atomically (a temporary file, then a
rename) and checked on load, so a damaged or partial cache is rebuilt, never trusted.
"""

import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from datasets.split import DataSplit

#: Value of the positions after a review's end in a padded batch (no vocabulary index).
PAD = -1
#: Bump when what a cache holds changes: older caches then no longer match.
CACHE_VERSION = 1


@dataclass
class TextSplit(DataSplit):
    """A ``DataSplit`` of token sequences: ``input_shape`` is (longest sequence,),
    ``vocab_size`` the number of token indices a model must embed."""

    vocab_size: int = 0
    input_dtype: torch.dtype = torch.int64


class Sequences(Dataset):
    """Variable-length token sequences with one label each, stored flat.

    ``tokens`` holds every sequence one after another; sequence ``i`` is
    ``tokens[offsets[i]:offsets[i + 1]]``. Items are ``(int64 tokens, label)``; ``collate``
    pads a batch with ``PAD`` to its longest sequence.
    """

    def __init__(self, tokens, offsets, labels):
        self.tokens, self.offsets, self.labels = tokens, offsets, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.tokens[self.offsets[index] : self.offsets[index + 1]].long(), self.labels[index]

    @staticmethod
    def collate(batch):
        """``(B, longest) int64`` tokens padded with ``PAD`` at the end, and ``(B,)`` labels."""
        sequences, labels = zip(*batch)
        padded = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=PAD)
        return padded, torch.stack(labels)


def flatten(sequences):
    """(flat int32 tokens, int64 offsets) of a list of token-index lists."""
    lengths = torch.tensor([0] + [len(s) for s in sequences], dtype=torch.int64)
    flat = torch.tensor([t for s in sequences for t in s], dtype=torch.int32)
    return flat, lengths.cumsum(0)


def check_flat(tokens, offsets, labels, vocab_size):
    """Whether ``(tokens, offsets, labels)`` is a consistent flat store of indices < vocab_size."""
    return (
        offsets.dtype == torch.int64
        and offsets.dim() == tokens.dim() == 1
        and len(offsets) == len(labels) + 1
        and int(offsets[0]) == 0
        and int(offsets[-1]) == len(tokens)
        and bool((offsets.diff() >= 0).all())
        and (len(tokens) == 0 or 0 <= int(tokens.min()) <= int(tokens.max()) < vocab_size)
    )


def source_key(files, root, settings):
    """A hash of ``root`` (absolute), ``files`` (path relative to it, size, modification time)
    and ``settings``: one cache directory serves every data folder."""
    digest = hashlib.sha256(
        repr((CACHE_VERSION, str(Path(root).resolve()), sorted(settings.items()))).encode()
    )
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def cached(directory, name, key, build, valid):
    """The tokenised data ``build()`` returns, read from the cache ``directory`` when there.

    The cache file is ``directory/<name>-<key>.pt`` (the directory is made where missing). One
    that cannot be read, belongs to another key or fails ``valid(content)`` is rebuilt. A
    directory that cannot be made or written is noted (the data is then tokenised on every
    start), never an error.
    """
    path = Path(directory) / f"{name}-{key}.pt"
    try:
        content = torch.load(path, weights_only=True)
        if isinstance(content, dict) and content.get("key") == key and valid(content):
            return content
    except Exception:  # noqa: BLE001 - absent, or damaged or partial in any way: rebuild it
        pass
    content = dict(build(), key=key)
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=path.name, suffix=".tmp")
    except OSError as error:
        _note_uncached(name, directory, error)
        return content
    try:
        with os.fdopen(descriptor, "wb") as handle:
            torch.save(content, handle)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shared cache from its users
        os.replace(temporary, path)  # atomic: readers see the old file or the whole new one
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        _note_uncached(name, directory, error)
    return content


def _note_uncached(name, directory, error):
    warnings.warn(
        f"cannot cache the tokenised {name} data in {directory} "
        f"({error.strerror or error}); it is tokenised again on every start",
        stacklevel=3,
    )
