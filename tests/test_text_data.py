"""The text data sets: IMDB in both layouts with its cache (in the cache directory, never the
data folder), the WordPiece vocabulary, packing and BERT's masking, and the plain-text corpus
loader."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import datasets
from datasets import imdb, wikipedia, wordpiece
from datasets.text import PAD
from tests.imdb_sample import reviews, write_acl, write_csv

LICENSES = Path("/usr/share/common-licenses")


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """The user's cache directory, here: the default cache lands in tmp_path."""
    home = tmp_path / "cache-home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "spardl-repro"


def _listing(folder):
    """Every path below ``folder`` (hidden ones too) with its size and modification time."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(Path(folder).rglob("*"))
    }


@pytest.fixture
def imdb_dirs(tmp_path):
    train, test = reviews(12, seed=1), reviews(4, seed=2)
    test[0] = ("Xylophone zebra xylophone!", 0)  # test-only words; zebra is also in unsup
    folders = {layout: tmp_path / layout for layout in ("acl", "csv")}
    for folder in folders.values():
        folder.mkdir()
    write_acl(folders["acl"], train, test)
    write_csv(folders["csv"], train, test)
    return folders


def test_normalisation_is_the_authors():
    assert imdb.normalise("Great<br />film, 10/10!It's OK...") == [
        "great",
        "film",
        "!",
        "it",
        "s",
        "ok",
        ".",
        ".",
        ".",
    ]


def test_both_layouts_load_to_the_same_tokens(imdb_dirs):
    acl, csv = (
        datasets.load("imdb", imdb_dirs[layout], vocab_size=30) for layout in ("acl", "csv")
    )
    for part in ("train", "test"):
        for name in ("tokens", "offsets", "labels"):
            assert torch.equal(getattr(getattr(acl, part), name), getattr(getattr(csv, part), name))
    assert (acl.num_classes, acl.vocab_size, acl.input_shape) == (2, 31, (500,))
    assert acl.train.labels.tolist() == [0] * 12 + [1] * 12
    # DATA_DIR may also be the aclImdb folder itself
    inner = datasets.load("imdb", imdb_dirs["acl"] / "aclImdb", vocab_size=30)
    assert torch.equal(inner.train.tokens, acl.train.tokens)


def test_vocabulary_comes_from_the_training_split_only(imdb_dirs):
    split = datasets.load("imdb", imdb_dirs["csv"], vocab_size=10_000)
    tokens, _ = split.test[0]
    rare = split.vocab_size - 1
    assert tokens.tolist()[:3] == [rare, rare, rare]  # xylophone zebra xylophone
    assert len(tokens) == 4 and tokens[3] < rare  # "!" is a training word
    counts = torch.bincount(split.train.tokens.long(), minlength=split.vocab_size)
    assert counts[rare] == 0  # every training word is in a vocabulary this large
    assert (counts[:-2] >= counts[1:-1]).all()  # indices by falling frequency
    short = datasets.load("imdb", imdb_dirs["csv"], max_tokens=4)
    assert max(len(short.train[i][0]) for i in range(len(short.train))) == 4


def test_vocabulary_size_keeps_the_most_frequent_words():
    index = imdb.vocabulary([["b", "a", "c", "a"], ["b", "d", "a"]], 2)
    assert index == {"a": 0, "b": 1}  # c and d share the rare index 2


def test_padded_batches_end_in_padding(imdb_dirs):
    split = datasets.load("imdb", imdb_dirs["acl"])
    items = [split.train[i] for i in (0, 1, 2)]
    tokens, labels = split.train.collate(items)
    longest = max(len(t) for t, _ in items)
    assert tokens.shape == (3, longest) and labels.tolist() == [0, 0, 0]
    for row, (sequence, _) in zip(tokens, items):
        assert torch.equal(row[: len(sequence)], sequence) and (row[len(sequence) :] == PAD).all()


def test_cache_is_used_on_the_second_load_and_rebuilt_when_damaged(
    imdb_dirs, monkeypatch, cache_home
):
    folder = imdb_dirs["csv"]
    before = _listing(folder)
    first = datasets.load("imdb", folder, vocab_size=30)
    assert _listing(folder) == before  # nothing written into the data folder
    (cache,) = cache_home.glob("imdb-*.pt")
    stamp = cache.stat().st_mtime_ns

    def no_tokenising(text):
        raise AssertionError("tokenised again although cached")

    with monkeypatch.context() as patched:  # undone alone: the cache home stays
        patched.setattr(imdb, "normalise", no_tokenising)
        second = datasets.load("imdb", folder, vocab_size=30)
    assert torch.equal(first.train.tokens, second.train.tokens)
    assert cache.stat().st_mtime_ns == stamp
    for damage in (cache.read_bytes()[: len(cache.read_bytes()) // 2], b"not a cache"):
        cache.write_bytes(damage)
        again = datasets.load("imdb", folder, vocab_size=30)
        assert torch.equal(again.test.tokens, first.test.tokens)
        assert torch.load(cache, weights_only=True)["key"] in cache.name
    # a readable cache whose content is wrong is not trusted either
    content = torch.load(cache, weights_only=True)
    content["train"]["tokens"][0] = 10_000
    torch.save(content, cache)
    assert torch.equal(
        datasets.load("imdb", folder, vocab_size=30).train.tokens, first.train.tokens
    )
    # other settings, or another data folder with the same files: another cache file
    datasets.load("imdb", folder, vocab_size=20)
    assert len(list(cache_home.glob("imdb-*.pt"))) == 2
    copy = folder.parent / "copy"
    shutil.copytree(folder, copy)
    datasets.load("imdb", copy, vocab_size=20)
    assert len(list(cache_home.glob("imdb-*.pt"))) == 3
    assert _listing(folder) == before


def test_caches_go_to_the_cache_dir_given_and_it_is_made(imdb_dirs, tmp_path, cache_home):
    folder, cache_dir = imdb_dirs["acl"], tmp_path / "my" / "cache"
    before = _listing(folder)
    datasets.load("imdb", folder, cache_dir=cache_dir, vocab_size=30)
    assert [path.name.startswith("imdb-") for path in cache_dir.iterdir()] == [True]
    assert not cache_home.exists() and _listing(folder) == before


def test_the_default_cache_dir_follows_xdg_cache_home_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert datasets.default_cache_dir() == str(tmp_path / "xdg" / "spardl-repro")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert datasets.default_cache_dir() == str(tmp_path / "home" / ".cache" / "spardl-repro")


def test_an_unwritable_cache_directory_is_noted_not_fatal(imdb_dirs, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.warns(UserWarning, match="cannot cache the tokenised imdb data"):
        split = datasets.load("imdb", imdb_dirs["acl"])
    assert len(split.train) == 24 and not list(imdb_dirs["acl"].rglob("*imdb-*"))


def test_csv_reviews_with_unquoted_commas_read_as_the_rest_of_the_line(tmp_path):
    rows = [
        "1,a fine film, well acted",  # not valid 'label,review' CSV: the rest of the line
        '0,"quoted, with ""quotes"" and a\nline break"',  # valid quoted CSV keeps working
        "neg,plain",
        'pos,"half" quoted, then more',
    ]
    for part in ("train", "test"):
        (tmp_path / f"imdb_{part}.csv").write_text("label,review\n" + "\n".join(rows) + "\n")
    assert imdb._read_csv(tmp_path, None, "train") == [
        ("a fine film, well acted", 1),
        ('quoted, with "quotes" and a\nline break', 0),
        ("plain", 0),
        ('"half" quoted, then more', 1),
    ]
    split = datasets.load("imdb", tmp_path, vocab_size=30)
    assert split.train.labels.tolist() == [1, 0, 0, 1]


@pytest.mark.parametrize(
    "layout, damage, message",
    [
        ("none", None, r"imdb: no data in .*aclImdb folder .*imdb_train\.csv"),
        ("csv", "label,review\n2,great film\n", r"imdb_train\.csv line 2 is not 'label,review'"),
        ("csv", "label,review\n", r"imdb_train\.csv holds no reviews"),
        ("csv", b"label,review\n1,\xff\xfe\n", r"cannot read .*imdb_train\.csv"),
    ],
)
def test_missing_or_malformed_imdb_says_which_layout_is_expected(
    imdb_dirs, tmp_path, layout, damage, message
):
    folder = tmp_path / "empty" if layout == "none" else imdb_dirs[layout]
    folder.mkdir(exist_ok=True)
    if damage is not None:
        path = folder / "imdb_train.csv"
        path.write_bytes(damage) if isinstance(damage, bytes) else path.write_text(damage)
    with pytest.raises(datasets.DataError, match=message):
        datasets.load("imdb", folder)


def test_unknown_loader_options_are_refused():
    with pytest.raises(
        datasets.DataError, match=r"takes no option\(s\) seq_len .*vocab_size, max_tokens"
    ):
        datasets.load("imdb", ".", seq_len=3)


def test_wordpiece_merges_the_most_frequent_pairs():
    vocab = wordpiece.train({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 100)
    # worked by hand: ##e ##s (9, tie broken by order), ##es ##t (9), ##o ##w (7), l ##ow (7),
    # ##e ##w (6), ##ew ##est, n ##ewest, ##d ##est (3), ##i ##dest, w ##idest, ##e ##r (2),
    # low ##er
    assert vocab[len(wordpiece.SPECIALS) :] == [
        "##d",
        "##e",
        "##i",
        "##o",
        "##r",
        "##s",
        "##t",
        "##w",
        "l",
        "n",
        "w",
        "##es",
        "##est",
        "##ow",
        "low",
        "##ew",
        "##ewest",
        "newest",
        "##dest",
        "##idest",
        "widest",
        "##er",
        "lower",
    ]
    assert len(wordpiece.train({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 20)) == 20
    encoder = wordpiece.WordPiece(vocab)
    pieces = {
        word: [vocab[i] for i in encoder.encode_word(word)] for word in ("lowest", "newer", "q")
    }
    assert pieces == {"lowest": ["low", "##est"], "newer": ["n", "##ew", "##er"], "q": ["[UNK]"]}
    assert encoder.encode("Low, LOWER!") == [
        vocab.index("low"),
        wordpiece.UNK,
        vocab.index("lower"),
        wordpiece.UNK,
    ]


def test_packing_fills_sequences_in_order():
    rows = wikipedia.pack(list(range(10, 17)), seq_len=5)
    C, S, P = wordpiece.CLS, wordpiece.SEP, wordpiece.PAD
    assert rows.tolist() == [[C, 10, 11, 12, S], [C, 13, 14, 15, S], [C, 16, S, P, P]]


def test_masking_statistics_are_berts():
    generator = torch.Generator().manual_seed(1)
    sequences = torch.randint(5, 1000, (400, 128), generator=generator)
    sequences[:, 0], sequences[:, -1], sequences[:3, 60:] = (
        wordpiece.CLS,
        wordpiece.SEP,
        wordpiece.PAD,
    )
    inputs, labels = wikipedia.mask(sequences, 1000, 0.15, generator)
    chosen = labels != wikipedia.IGNORE
    candidates = sequences > wordpiece.MASK
    assert not chosen[~candidates].any() and torch.equal(labels[chosen], sequences[chosen])
    assert torch.equal(inputs[~chosen], sequences[~chosen])
    assert abs(chosen.sum() / candidates.sum() - 0.15) < 0.005  # 51,000 candidates: sd 0.0016
    masked = (inputs[chosen] == wordpiece.MASK).float().mean()
    kept = (inputs[chosen] == sequences[chosen]).float().mean()
    assert abs(masked - 0.8) < 0.015 and abs(kept - 0.1) < 0.01  # 7,600 chosen: sd 0.0046, 0.0034
    replaced = inputs[chosen & (inputs != wordpiece.MASK) & (inputs != sequences)]
    assert replaced.min() >= len(wordpiece.SPECIALS)
    lonely = torch.full((2, 6), 7)
    lonely[:, 0], lonely[:, 2:] = wordpiece.CLS, wordpiece.PAD
    assert ((wikipedia.mask(lonely, 100, 1e-9)[1] != wikipedia.IGNORE).sum(1) == 1).all()


def _corpus(tmp_path, paragraphs):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    half = len(paragraphs) // 2
    (folder / "a.txt").write_text("\n\n".join(paragraphs[:half]))
    (folder / "sub" / "b.txt").write_text("\n  \n".join(paragraphs[half:]))
    return folder


def test_corpus_holds_out_every_nth_paragraph_with_a_training_vocabulary(tmp_path):
    paragraphs = [f"the cat sat on mat number {i} and the dog ran" for i in range(39)]
    paragraphs.insert(19, "quiz quiz")  # the 20th paragraph is held out: q is never trained
    split = datasets.load("wikipedia", _corpus(tmp_path, paragraphs), vocab_size=60, seq_len=8)
    assert len(split.train[0]) == 8 and split.input_shape == (8,)
    assert split.num_classes == split.vocab_size <= 60
    inputs, labels = split.test[0]
    originals = torch.where(labels == wikipedia.IGNORE, inputs, labels)
    assert originals.tolist()[:3] == [wordpiece.CLS, wordpiece.UNK, wordpiece.UNK]  # "quiz quiz"
    assert wordpiece.UNK not in split.train.sequences.flatten().tolist()
    again = datasets.load(
        "wikipedia", _corpus(tmp_path / "copy", paragraphs), vocab_size=60, seq_len=8
    )
    assert torch.equal(again.test.tensors[1], split.test.tensors[1])  # fixed held-out masks


@pytest.mark.skipif(not LICENSES.is_dir(), reason="no /usr/share/common-licenses on this machine")
def test_a_real_corpus_trains_a_vocabulary_that_covers_it(tmp_path):
    corpus = tmp_path / "licenses"
    corpus.mkdir()
    for name in ("Apache-2.0", "GPL-3"):
        shutil.copy(LICENSES / name, corpus)
    before = _listing(corpus)
    split = datasets.load("wikipedia", corpus, vocab_size=2000, seq_len=64)
    assert _listing(corpus) == before  # the cache went elsewhere
    assert 1000 < split.vocab_size <= 2000 and len(split.train) > 100 and len(split.test) > 3
    unknown = (split.train.sequences == wordpiece.UNK).float().mean()
    assert unknown < 0.001
    one_file = datasets.load("wikipedia", corpus / "GPL-3", vocab_size=500, seq_len=32)
    assert one_file.vocab_size <= 500


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent", "does not exist"),
        (lambda d: d, "holds no text files"),
        (
            lambda d: (d / "x.bin").write_bytes(b"text\0\1\2") and d,
            "x.bin is not readable UTF-8 text",
        ),
        (lambda d: (d / "x.txt").write_bytes(b"caf\xe9") and d, "x.txt is not readable UTF-8 text"),
        (lambda d: (d / "x.txt").write_text("one paragraph") and d, "too few to hold out"),
    ],
)
def test_bad_corpora_say_what_is_expected(tmp_path, make, message):
    with pytest.raises(datasets.DataError, match=message):
        datasets.load("wikipedia", make(tmp_path))
    assert os.listdir(tmp_path) in ([], ["x.bin"], ["x.txt"])
