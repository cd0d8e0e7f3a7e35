"""A plain-text corpus for BERT's masked-language-model pre-training (``--dataset wikipedia``).

``DATA_DIR`` is one UTF-8 text file or a directory of them (every non-hidden file below it, in
path order; a Wikipedia dump extracted to text, or any English text). The text is split into
paragraphs at blank lines; every ``round(1 / test_fraction)``-th paragraph is held out for
testing. A WordPiece vocabulary of ``vocab_size`` pieces is trained on the training paragraphs
only (``datasets.wordpiece``). Each part's paragraphs, encoded one after another, are packed
into sequences ``[CLS] t1 .. tn [SEP]`` of ``seq_len`` tokens (the last one padded with
``[PAD]``).

Masking (BERT's): ``mask_probability`` of the real tokens (never [CLS], [SEP], [PAD]) are
chosen, at least one per sequence; a chosen token is replaced by [MASK] with probability 0.8,
by a random non-special token with 0.1 and kept with 0.1, and only chosen tokens are
predicted (the other labels are -100, which the loss ignores). Training batches are masked
afresh each time they are drawn (from torch's global random generator, which checkpoints
restore); the test set is masked once, with a fixed seed, so every evaluation scores the
same predictions.
"""

import re
from collections import Counter
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from datasets import wordpiece
from datasets.split import DataError
from datasets.text import TextSplit, cached, source_key

LAYOUT = (
    "the wikipedia data set is plain UTF-8 text: DATA_DIR is one text file or a directory "
    "of them (for example Wikipedia extracted to text with WikiExtractor, or "
    "/usr/share/common-licenses)"
)
IGNORE = -100  # label of the positions that are not predicted
TEST_SEED = 0  # the held-out masking's seed


def load(
    data_dir, cache_dir, vocab_size=8000, seq_len=128, mask_probability=0.15, test_fraction=0.05
):
    """The masked-language-model ``TextSplit`` of the corpus at ``data_dir``: ``num_classes`` and
    ``vocab_size`` are the vocabulary's size, ``input_shape`` is ``(seq_len,)``; the tokens are
    cached in ``cache_dir`` (``datasets.text.cached``)."""
    if not (
        isinstance(vocab_size, int)
        and vocab_size > len(wordpiece.SPECIALS)
        and isinstance(seq_len, int)
        and seq_len >= 3
        and 0 < mask_probability < 1
        and 0 < test_fraction <= 0.5
    ):
        raise DataError(
            f"wikipedia: needs vocab_size > {len(wordpiece.SPECIALS)}, seq_len >= 3, "
            f"mask_probability in (0, 1) and test_fraction in (0, 0.5]; got "
            f"{vocab_size!r}, {seq_len!r}, {mask_probability!r}, {test_fraction!r}"
        )
    data_dir = Path(data_dir)
    files = _files(data_dir)
    root = data_dir if data_dir.is_dir() else data_dir.parent
    settings = {
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "mask_probability": mask_probability,
        "test_fraction": test_fraction,
    }

    def build():
        paragraphs = [p for path in files for p in _paragraphs(path)]
        every = round(1 / test_fraction)
        parts = {
            "train": [p for i, p in enumerate(paragraphs) if (i + 1) % every],
            "test": paragraphs[every - 1 :: every],
        }
        if not parts["test"]:
            raise DataError(
                f"wikipedia: {data_dir} holds {len(paragraphs)} paragraph(s): too "
                f"few to hold out one in {every} for testing"
            )
        counts = Counter(w for p in parts["train"] for w in wordpiece.words(p))
        encoder = wordpiece.WordPiece(wordpiece.train(counts, vocab_size))
        train = pack([i for p in parts["train"] for i in encoder.encode(p)], seq_len)
        inputs, labels = mask(
            pack([i for p in parts["test"] for i in encoder.encode(p)], seq_len),
            len(encoder.vocab),
            mask_probability,
            torch.Generator().manual_seed(TEST_SEED),
        )
        return {
            "vocab": encoder.vocab,
            "train": train,
            "test_inputs": inputs,
            "test_labels": labels,
        }

    def valid(content):
        size = len(content["vocab"])
        return (
            content["train"].dim() == 2
            and content["train"].shape[1] == seq_len
            and content["test_inputs"].shape == content["test_labels"].shape
            and content["test_inputs"].shape[1:] == (seq_len,)
            and len(content["train"]) > 0
            and all(
                0 <= int(t.min()) and int(t.max()) < size
                for t in (content["train"], content["test_inputs"])
            )
        )

    content = cached(cache_dir, "wikipedia", source_key(files, root, settings), build, valid)
    size = len(content["vocab"])
    train = MaskedSequences(content["train"], size, mask_probability)
    test = TensorDataset(content["test_inputs"], content["test_labels"])
    return TextSplit(
        train=train, test=test, num_classes=size, input_shape=(seq_len,), vocab_size=size
    )


def pack(tokens, seq_len):
    """``(N, seq_len)`` int64 sequences ``[CLS] .. [SEP]`` holding ``tokens`` in order; the last
    one padded with [PAD] after its [SEP]."""
    body = seq_len - 2
    stream = torch.tensor(tokens, dtype=torch.int64)
    count = -(-len(stream) // body)
    rows = torch.full((count, seq_len), wordpiece.PAD, dtype=torch.int64)
    lengths = torch.full((count,), body)
    lengths[-1:] = len(stream) - body * (count - 1)
    positions = torch.arange(seq_len)
    real = (positions >= 1) & (positions.unsqueeze(0) <= lengths.unsqueeze(1))
    rows[real] = stream
    rows[:, 0] = wordpiece.CLS
    rows[torch.arange(count), lengths + 1] = wordpiece.SEP
    return rows


def mask(sequences, vocab_size, probability, generator=None):
    """``(inputs, labels)`` of BERT's masking of ``sequences`` (see the module's description)."""
    candidates = sequences > wordpiece.SEP  # [UNK], [MASK] and real pieces; not PAD/CLS/SEP
    candidates &= sequences != wordpiece.MASK
    draw = torch.rand(sequences.shape, generator=generator)
    chosen = (draw < probability) & candidates
    # A sequence with nothing chosen gets its candidate of the highest draw: every sequence
    # predicts something (a batch with no prediction would have no loss).
    empty = ~chosen.any(dim=1) & candidates.any(dim=1)
    best = torch.where(candidates, draw, -1.0).argmax(dim=1)
    chosen[empty.nonzero().squeeze(1), best[empty]] = True
    action = torch.rand(sequences.shape, generator=generator)
    randoms = torch.randint(
        len(wordpiece.SPECIALS), vocab_size, sequences.shape, generator=generator
    )
    inputs = torch.where(chosen & (action < 0.8), wordpiece.MASK, sequences)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), randoms, inputs)
    return inputs, torch.where(chosen, sequences, IGNORE)


class MaskedSequences(Dataset):
    """Packed training sequences, masked afresh in every batch by ``collate``."""

    def __init__(self, sequences, vocab_size, probability):
        self.sequences, self.vocab_size, self.probability = sequences, vocab_size, probability

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, index):
        return self.sequences[index]

    def collate(self, batch):
        """``(inputs, labels)`` of a freshly masked batch."""
        return mask(torch.stack(batch), self.vocab_size, self.probability)


def _files(data_dir):
    if data_dir.is_file():
        return [data_dir]
    if not data_dir.is_dir():
        raise DataError(f"wikipedia: {data_dir} does not exist; {LAYOUT}")
    files = sorted(
        path
        for path in data_dir.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(data_dir).parts)
    )
    if not files:
        raise DataError(f"wikipedia: {data_dir} holds no text files; {LAYOUT}")
    return files


def _paragraphs(path):
    """The non-empty paragraphs (blank-line separated, whitespace collapsed) of one file."""
    try:
        raw = path.read_bytes()
        if b"\0" in raw:
            raise UnicodeDecodeError(
                "utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "a NUL byte: binary data"
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(
            f"wikipedia: {path} is not readable UTF-8 text ({error}); {LAYOUT}"
        ) from None
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text) if block.strip()]
