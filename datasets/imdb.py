"""IMDB movie reviews (sentiment: 0 negative, 1 positive), tokenised as in the SparDL authors' code.

Two layouts are read from ``DATA_DIR``:
- the public release, ``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` (one review per file;
  ``unsup`` and the other files are ignored); ``DATA_DIR`` may also be ``aclImdb`` itself;
- the authors' ``imdb_train.csv`` and ``imdb_test.csv``: a header line, then ``label,review``
  per row (label 0/1 or neg/pos). A row that is valid quoted CSV is read as CSV; any other line
  is the label up to its first comma and the review after it, commas included.
Reviews are normalised (lower case, ``<br />`` removed, ``. ! ?`` split off as tokens, every other
character but a-z a space) and cut at ``max_tokens`` words. The vocabulary is the training
part's ``vocab_size`` most frequent words (ties alphabetical), indices 0..vocab_size-1 by
frequency; every other word (and an empty review's single token) is the shared index
``vocab_size``, so a model embeds ``vocab_size + 1`` indices. Samples are in the order of the
layout (aclImdb: neg, then pos, by review id; CSV: by row).
"""

import csv
import re
from collections import Counter
from pathlib import Path

import torch

from datasets.split import DataError
from datasets.text import Sequences, TextSplit, cached, check_flat, flatten, source_key

LAYOUT = (
    "IMDB is expected in DATA_DIR as the public aclImdb folder (DATA_DIR/aclImdb/"
    "{train,test}/{neg,pos}/*.txt, from https://ai.stanford.edu/~amaas/data/sentiment/) or as "
    "the files DATA_DIR/imdb_train.csv and DATA_DIR/imdb_test.csv (a header line, then "
    "label,review per row)"
)
PARTS = ("train", "test")
CLASSES = ("neg", "pos")
_LABELS = {"0": 0, "neg": 0, "negative": 0, "1": 1, "pos": 1, "positive": 1}


def normalise(text):
    """The word and punctuation tokens of one review."""
    text = text.lower().replace("<br />", " ")
    text = re.sub(r"([.!?])", r" \1 ", text)
    return re.sub(r"[^a-z.!?]+", " ", text).split()


def load(data_dir, cache_dir, vocab_size=50000, max_tokens=500):
    """The IMDB ``TextSplit`` found in ``data_dir`` (see the module's description); the tokens
    are cached in ``cache_dir`` (``datasets.text.cached``)."""
    if not (
        isinstance(vocab_size, int)
        and vocab_size >= 1
        and isinstance(max_tokens, int)
        and max_tokens >= 1
    ):
        raise DataError(
            f"imdb: vocab_size and max_tokens must be whole numbers >= 1, "
            f"got {vocab_size!r} and {max_tokens!r}"
        )
    root, files, reader = _find(Path(data_dir))
    settings = {"vocab_size": vocab_size, "max_tokens": max_tokens, "layout": reader.__name__}

    def build():
        texts = {part: reader(root, files, part) for part in PARTS}
        words = {
            part: [normalise(review)[:max_tokens] for review, _ in texts[part]] for part in PARTS
        }
        index = vocabulary(words["train"], vocab_size)
        content = {}
        for part in PARTS:
            tokens, offsets = flatten(
                [
                    [index.get(w, vocab_size) for w in review] or [vocab_size]
                    for review in words[part]
                ]
            )
            content[part] = {
                "tokens": tokens,
                "offsets": offsets,
                "labels": torch.tensor([label for _, label in texts[part]]),
            }
        return content

    def valid(content):
        return all(
            check_flat(
                content[p]["tokens"], content[p]["offsets"], content[p]["labels"], vocab_size + 1
            )
            and len(content[p]["labels"])
            for p in PARTS
        )

    content = cached(cache_dir, "imdb", source_key(files, root, settings), build, valid)
    train, test = (Sequences(**content[part]) for part in PARTS)
    return TextSplit(
        train=train, test=test, num_classes=2, input_shape=(max_tokens,), vocab_size=vocab_size + 1
    )


def vocabulary(reviews, size):
    """``{word: index}`` of the ``size`` most frequent words of ``reviews`` (ties alphabetical)."""
    counts = Counter(word for review in reviews for word in review)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]
    return {word: index for index, (word, _) in enumerate(ranked)}


def _find(data_dir):
    """(root directory, source files, reader) of the layout in ``data_dir``, or ``DataError``."""
    for root in (data_dir / "aclImdb", data_dir):
        if all((root / part / label).is_dir() for part in PARTS for label in CLASSES):
            files = [
                path
                for part in PARTS
                for label in CLASSES
                for path in sorted((root / part / label).glob("*.txt"), key=_review_id)
            ]
            return root, files, _read_folders
    csvs = [data_dir / f"imdb_{part}.csv" for part in PARTS]
    if all(path.is_file() for path in csvs):
        return data_dir, csvs, _read_csv
    raise DataError(f"imdb: no data in {data_dir}. {LAYOUT.replace('DATA_DIR', str(data_dir))}")


def _review_id(path):
    """aclImdb's ``<id>_<rating>.txt`` sorted by id as a number; other names after, by name."""
    head = path.stem.split("_")[0]
    return (0, int(head), path.name) if head.isdigit() else (1, 0, path.name)


def _read_folders(root, files, part):
    """[(review, label)] of aclImdb's ``part``."""
    reviews = []
    for path in files:
        if path.parent.parent.name == part:
            reviews.append((_read(path), CLASSES.index(path.parent.name)))
    if not reviews:
        raise DataError(f"imdb: {root / part} holds no reviews (*.txt in neg/ and pos/). {LAYOUT}")
    return reviews


def _read_csv(root, files, part):
    """[(review, label)] of ``imdb_<part>.csv``."""
    path = root / f"imdb_{part}.csv"
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = _rows_with_text(handle)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"imdb: cannot read {path}: {error}. {LAYOUT}") from None
    reviews = []
    for number, row, text in rows[1:]:
        if not row:
            continue
        if len(row) != 2:  # not 'label,review' as CSV: the review is the rest of the line
            label, _, review = text.rstrip("\r\n").partition(",")
            row = [label, review]
        if row[0].strip().lower() not in _LABELS:
            raise DataError(
                f"imdb: {path} line {number} is not 'label,review' with label 0/1 or "
                f"neg/pos. {LAYOUT}"
            )
        reviews.append((row[1], _LABELS[row[0].strip().lower()]))
    if not reviews:
        raise DataError(f"imdb: {path} holds no reviews after its header line. {LAYOUT}")
    return reviews


def _rows_with_text(lines):
    """Return (first line number, CSV fields, raw text) of each record of ``lines``."""
    consumed = []

    def remembered():
        for line in lines:
            consumed.append(line)
            yield line

    reader, records, start = csv.reader(remembered()), [], 0
    for row in reader:
        records.append((start + 1, row, "".join(consumed[start : reader.line_num])))
        start = reader.line_num
    return records


def _read(path):
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"imdb: cannot read {path}: {error}") from None
